"""Prompts and decode with attention caches: TVM's paged KV cache (with ScanWeaver's CPU
attention kernels) against caches kept as tensors (a copy of the whole cache per token) and
transformers' ``generate``, as the context grows; one run.

    python -m bench.generate_attention [--contexts 256,2048] [--new 32] [--rounds 3]
                                       [--tensors-up-to 1024] [--out bench/out_generate_attention]

The shape: a Llama (``LlamaForCausalLM``, random weights) of hidden 512, 4 layers, 8 query
heads and 2 key/value heads of 64, vocabulary 32000; batch 1, greedy.  For each context
length (the prompt), the prefill milliseconds (ours: ``generate``'s prefill; transformers: a
``generate`` of one token), and the decode milliseconds per token of ``--new`` tokens (ours: the decode
steps of ``generate``; transformers: (time for ``--new`` tokens - time for 1) / (new - 1)),
medians of interleaved rounds, tokens checked equal to transformers'.  The paged cache's
decode should stay flat in the context; the tensors' grows with it (and their prefill, TVM's
unscheduled attention, grows past L^2: not run above ``--tensors-up-to``).  Writes
``generate_attention.json`` / ``.md``.
"""
import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")

from . import outputs  # noqa: E402


def main(argv=None):
    import torch
    import transformers

    import scanweaver_tvm as sw

    from .scan import _machine

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--contexts", default="256,2048")
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tensors-up-to", type=int, default=1024)
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "out_generate_attention"))
    args = p.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                                   num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=8192)
    model = transformers.LlamaForCausalLM(cfg).eval()
    compiled, compile_s = {}, {}
    for kind in ("paged", "tensors"):
        start = time.perf_counter()
        compiled[kind] = sw.compile_causal_lm(model, attention_cache=kind)
        compiled[kind].module()
        compile_s[kind] = time.perf_counter() - start
        print(f"{kind}: compiled in {compile_s[kind]:.1f} s", flush=True)

    def hf(ids, n):
        with torch.no_grad():
            start = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)
            return out, time.perf_counter() - start

    result = {"machine": _machine(), "config": cfg.to_dict(), "new": args.new, "compile_s": compile_s, "contexts": {}}
    lines = ["# Attention caches: paged KV cache vs tensors vs transformers (CPU)", "",
             f"{result['machine']['cpu']}, {result['machine']['cores']} cores; Llama hidden 512, 4 layers, "
             f"8/2 heads of 64, vocab 32000; {args.new} new tokens, greedy, batch 1; medians of {args.rounds} "
             "interleaved rounds.", "",
             "| context | prefill ms: paged | tensors | transformers | transformers / paged | "
             "decode ms/token: paged | tensors | transformers | transformers / paged | tokens equal |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for context in [int(c) for c in args.contexts.split(",")]:
        ids = torch.randint(0, cfg.vocab_size, (1, context), generator=torch.Generator().manual_seed(context))
        want, _ = hf(ids, args.new)
        paths = ["paged", "tensors"] if context <= args.tensors_up_to else ["paged"]
        same = all(torch.equal(compiled[p].generate(ids, max_new_tokens=args.new), want) for p in paths)
        rows = {"paged": [], "tensors": [], "hf": []}
        first_ms = {"paged": [], "tensors": [], "hf": []}
        for i in range(args.rounds):
            order = paths + ["hf"] if i % 2 == 0 else ["hf"] + paths[::-1]
            for name in order:
                if name == "hf":
                    total, first = hf(ids, args.new)[1], hf(ids, 1)[1]
                    rows["hf"].append(1e3 * (total - first) / (args.new - 1))
                    first_ms["hf"].append(1e3 * first)
                else:
                    compiled[name].generate(ids, max_new_tokens=args.new)
                    rows[name].append(1e3 / compiled[name].last_timings.decode_tokens_per_s)
                    first_ms[name].append(1e3 * compiled[name].last_timings.prefill_s)
        med = {k: statistics.median(v) if v else float("nan") for k, v in rows.items()}
        pre = {k: statistics.median(v) if v else float("nan") for k, v in first_ms.items()}
        result["contexts"][context] = {"rounds": rows, "medians": med, "prefill_rounds_ms": first_ms,
                                       "prefill_medians_ms": pre, "tokens_equal": same}
        tensors = (f"{pre['tensors']:.0f}", f"{med['tensors']:.2f}") if "tensors" in paths else ("not run",) * 2
        lines.append(f"| {context} | {pre['paged']:.0f} | {tensors[0]} | {pre['hf']:.0f} | "
                     f"{pre['hf'] / pre['paged']:.2f}x | {med['paged']:.2f} | {tensors[1]} | "
                     f"{med['hf']:.2f} | {med['hf'] / med['paged']:.2f}x | {same} |")
        print(lines[-1], flush=True)
    lines += ["", "Compile: " + ", ".join(f"{k} {v:.0f} s" for k, v in compile_s.items()) + "."]
    print("\n".join(lines))
    outputs.write(args.out, "generate_attention", result, "\n".join(lines) + "\n")
    return 0 if all(c["tokens_equal"] for c in result["contexts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
