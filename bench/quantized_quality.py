"""What each weight format costs in quality, ours next to OpenVINO's NNCF compression of the same
model in the same run.

    python -m bench.quantized_quality [--formats int8,int8_asym,int4,int4_asym_g32]
                                      [--checkpoint DIR | --random] [--prompts 64] [--prompt 32] [--new 16]
                                      [--layers 4] [--hidden 768]    (the random model's size)

The model: by default the demo's checkpoint (``scanweaver_tvm/demo_model``: a Mamba trained on
Shakespeare, saved in bf16), run in float32, its prompts cut from the text it never trained on
(the last 5%); ``--random``: HF ``MambaForCausalLM`` with random weights at ``--hidden``
(vocabulary 50280) and random prompts, whose near-tied logits any rounding flips (kept as the
worst case).  For each of ``--prompts`` prompts, transformers' float32 greedy continuation of
``--new`` tokens is the reference; every quantized model is fed those tokens (teacher forcing) and scored at each
continuation position: the largest logit error relative to the largest float32 logit (median
over positions), and whether its next token is float32's.  Ours: ``compile_causal_lm(weights=)``,
prefill then decode steps; OpenVINO: ``ov.convert_model`` of the float32 logits, NNCF's
``compress_weights`` in the same format, run at f32 (its default precision on AVX512-BF16 CPUs
is bf16, which would add its own error) on each full sequence.  Writes
``quantized_quality.json`` / ``.md`` into ``--out``.
"""
import argparse
import os
import statistics
import sys

import numpy as np

from . import outputs


DEMO_MODEL = os.path.join(os.path.dirname(__file__), "..", "scanweaver_tvm", "demo_model")


def trained(checkpoint, count, length):
    """The checkpoint in float32 and ``count`` prompts of ``length`` tokens cut evenly from the
    held-out end of the text it was trained on."""
    import torch
    import transformers

    from scanweaver_tvm.train_demo_model import HELD_OUT, read_text

    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    ids = tokenizer(read_text())["input_ids"]
    held = ids[int((1 - HELD_OUT) * len(ids)):]
    step = (len(held) - length) // count
    prompts = [torch.tensor([held[i * step:i * step + length]]) for i in range(count)]
    cfg = model.config
    about = (f"the demo's checkpoint ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, vocab "
             f"{cfg.vocab_size}, trained on Shakespeare, bf16 weights run in float32), prompts from its "
             "held-out text")
    return model, prompts, about


def reference(model, prompts, new):
    """transformers' float32 greedy tokens for each prompt, and its logits at every position."""
    import torch

    out = []
    with torch.no_grad():
        for ids in prompts:
            tokens = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new)
            out.append((tokens, model(tokens).logits[0].double().numpy()))
    return out


def score(logits_at, refs, prompt):
    """Median relative logit error and next-token agreement over the continuation positions;
    ``logits_at(i, tokens)`` -> the (positions, vocab) logits of reference ``i`` from ``prompt - 1``."""
    errors, agree, total = [], 0, 0
    for i, (tokens, want) in enumerate(refs):
        got = logits_at(i, tokens)
        for row, position in enumerate(range(prompt - 1, tokens.shape[1] - 1)):
            best = want[position]
            errors.append(float(np.abs(got[row] - best).max() / np.abs(best).max()))
            agree += int(got[row].argmax() == int(tokens[0, position + 1]))
            total += 1
    return {"median_error": statistics.median(errors), "agreement": agree / total, "positions": total}


def ours(model, spec, prompt):
    """``logits_at`` of our build in format ``spec``: prefill the prompt, decode the rest."""
    import scanweaver_tvm as sw

    lm = sw.compile_causal_lm(model, weights=spec)

    def logits_at(_, tokens):
        rows = []
        logits, states = lm.prefill(tokens[:, :prompt].numpy(), max_length=tokens.shape[1] + 1)
        for position in range(prompt - 1, tokens.shape[1] - 1):
            rows.append(logits.numpy()[0].astype(np.float64))
            logits, states = lm.decode(tokens[:, position + 1].numpy(), states)
        return np.stack(rows)

    return logits_at


def openvino(model, spec, refs, prompt):
    """``logits_at`` of OpenVINO f32 with NNCF's compression in format ``spec``, or None and why."""
    from .models_zoo import logits_module
    from .openvino_cpu import compile_openvino

    runs = {}                     # one conversion and compression a sequence length, not a sequence
    for tokens, _ in refs:
        if tokens.shape not in runs:
            runs[tokens.shape] = compile_openvino(logits_module(model), (tokens,), ("f32",), spec)["f32"]
    if any(run is None for run, _ in runs.values()):
        return None, next(why for run, why in runs.values() if run is None)
    chosen = next(iter(runs.values()))[1]
    return (lambda i, tokens: np.asarray(runs[tokens.shape][0](tokens), dtype=np.float64)[0, prompt - 1:-1]), chosen


def main(argv=None):
    import torch
    import transformers

    from .scan import _machine

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--formats", default="int8,int8_asym,int4,int4_asym_g32")
    p.add_argument("--checkpoint", default=None, help="a Mamba checkpoint directory (default: the demo's)")
    p.add_argument("--random", action="store_true", help="a random-weight model instead of a checkpoint")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new", type=int, default=16)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--vocab", type=int, default=50280)
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "out_generate"))
    args = p.parse_args(argv)
    torch.manual_seed(0)
    if args.random:
        cfg = transformers.MambaConfig(vocab_size=args.vocab, hidden_size=args.hidden, state_size=16,
                                       num_hidden_layers=args.layers, expand=2)
        model = transformers.MambaForCausalLM(cfg).eval()
        prompts = [torch.randint(0, args.vocab, (1, args.prompt), generator=torch.Generator().manual_seed(seed))
                   for seed in range(args.prompts)]
        about = (f"HF Mamba ({args.layers} layers, hidden {args.hidden}, vocab {args.vocab}, random weights), "
                 "random prompts")
    else:
        model, prompts, about = trained(args.checkpoint or DEMO_MODEL, args.prompts, args.prompt)
    refs = reference(model, prompts, args.new)
    rows = {}
    for spec in args.formats.split(","):
        rows[spec] = {"ours": score(ours(model, spec, args.prompt), refs, args.prompt)}
        peer, precision = openvino(model, spec, refs, args.prompt)
        rows[spec]["openvino"] = score(peer, refs, args.prompt) if peer else {"failed": precision}
        print(spec, rows[spec], flush=True)
    machine = _machine()
    lines = [f"# Quality of quantized weights, ours vs OpenVINO + NNCF: {about}", "",
             f"{machine['cpu']}, {machine['cores']} cores; {args.prompts} prompts of {args.prompt} tokens, "
             f"{args.new} greedy float32 tokens each, teacher-forced; OpenVINO at f32.", "",
             "| format | ours: median logit error | ours: next token = float32's | "
             "OpenVINO NNCF: median logit error | OpenVINO: next token = float32's |", "|---|---|---|---|---|"]
    for spec, row in rows.items():
        ov = row["openvino"]
        lines.append(f"| {spec} | {row['ours']['median_error']:.4f} | {row['ours']['agreement']:.1%} | "
                     + (f"{ov['median_error']:.4f} | {ov['agreement']:.1%} |" if "failed" not in ov
                        else f"{ov['failed']} | - |"))
    text = "\n".join(lines) + "\n"
    print(text)
    name = "quantized_quality_random" if args.random else "quantized_quality"
    outputs.write(args.out, name, {"model": about, "machine": machine, "args": vars(args), "rows": rows}, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
