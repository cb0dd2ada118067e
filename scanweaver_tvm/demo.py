"""``make demo``: the main job end to end on a Mamba checkpoint, as users have one.

    python -m scanweaver_tvm.demo [--checkpoint DIR] [--prompt TEXT] [--new-tokens 48] [--no-baseline]

The checkpoint (``scanweaver_tvm/demo_model``) is a small ``MambaForCausalLM`` trained in this
repository on Shakespeare's plays and saved with ``save_pretrained`` in bfloat16
(``train_demo_model.py``).  First a forward pass: the model (widened to float32, so the check
against PyTorch is a float32 one) is imported with ``sw.from_torch``, the demo prints what the
pass finds (one selective scan per layer), compiles it for this CPU, checks the logits against
PyTorch, and times it next to TVM without the pass (the unrolled loop) and PyTorch eager, all in
this run.  Then generation as a user runs it: ``compile_causal_lm(checkpoint_dir)`` (bf16, as
stored) continues the prompt, and the text is printed next to transformers' ``generate`` of the
same checkpoint, with the time to the first token and the decode rate of both.
"""
import argparse
import contextlib
import os
import sys
import time

import numpy as np
import torch
import tvm
from tvm import relax

from . import api


def _version(package):
    from importlib.metadata import version

    return version(package)


def _step(what):
    print(f"  {what} ...", end="", flush=True)
    return time.perf_counter()


def _done(t0):
    dt = time.perf_counter() - t0
    print(f" {dt:.1f} s", flush=True)
    return dt


@contextlib.contextmanager
def _native_stderr_silenced():
    """TVM's C++ logs one warning per ``take`` of the unrolled graph (thousands of lines at
    L=1024) straight to file descriptor 2; keep them off the demo's output."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _median_ms(fn, repeats=20):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t0))
    return float(np.median(times))


def _vm(ex, args):
    vm = relax.VirtualMachine(ex, tvm.cpu())
    tensors = [tvm.runtime.tensor(a.numpy()) for a in args]
    return lambda: vm["main"](*tensors)


CHECKPOINT = os.path.join(os.path.dirname(__file__), "demo_model")
PROMPT = "ROMEO:\nBut soft, what light through yonder window breaks?\n"
PASSAGE = ("Shall I compare thee to a summer's day?\nThou art more lovely and more temperate:\n"
           "Rough winds do shake the darling buds of May,\nAnd summer's lease hath all too short a date;\n"
           "Sometime too hot the eye of heaven shines,\nAnd often is his gold complexion dimm'd;\n"
           "And every fair from fair sometime declines,\nBy chance or nature's changing course untrimm'd;\n"
           "But thy eternal summer shall not fade,\nNor lose possession of that fair thou ow'st;\n"
           "Nor shall death brag thou wander'st in his shade,\nWhen in eternal lines to time thou grow'st:\n"
           "So long as men can breathe or eyes can see,\nSo long lives this, and this gives life to thee.\n")


def main(argv=None):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=CHECKPOINT,
                        help="a Mamba-family checkpoint directory (default: the demo's)")
    parser.add_argument("--prompt", default=PROMPT, help="the text to continue")
    parser.add_argument("--no-baseline", action="store_true", help="skip compiling TVM without the pass")
    parser.add_argument("--new-tokens", type=int, default=48,
                        help="tokens to generate after the prompt, next to transformers (0 skips)")
    args = parser.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32).eval()
    inputs = [tokenizer(PASSAGE, return_tensors="pt")["input_ids"]]
    print(f"ScanWeaver-TVM demo: {args.checkpoint} ({type(model).__name__}, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters), "
          f"transformers {_version('transformers')}, TVM {tvm.__version__}, target {api._target('llvm')}")
    print(f"\n  a forward pass over a sonnet ({inputs[0].shape[1]} tokens), the model widened to float32:")
    t0 = _step("importing from PyTorch (torch.export + Relax frontend)")
    mod = api.from_torch(model, inputs)
    _done(t0)
    print("  recurrences found:")
    for rec in api.find_recurrences(mod, include_rejected=True):
        print(f"    {rec}")
    t0 = _step("compiling with ScanWeaver")
    ex = api.compile(mod, "llvm")
    run = _vm(ex, inputs)                            # TVM generates the machine code here
    ours_compile = _done(t0)
    got = run()[0].numpy()
    with torch.no_grad():
        want = model(*inputs, use_cache=False).logits.numpy()
    err = float(np.abs(got - want).max() / max(1e-30, np.abs(want).max()))
    ok = err <= 1e-4
    print(f"  check against PyTorch: max relative error {err:.1e} ({'OK' if ok else 'MISMATCH'})")
    rows = [("ScanWeaver (TVM + pass)", ours_compile, _median_ms(run))]
    if not args.no_baseline:
        t0 = _step("compiling with TVM alone: the unrolled loop (--no-baseline skips it)")
        with _native_stderr_silenced():
            ex_plain = tvm.compile(mod, target=api._target("llvm"))
            run_plain = _vm(ex_plain, inputs)      # TVM generates the machine code here
        plain_compile = _done(t0)
        rows.append(("TVM without the pass", plain_compile, _median_ms(run_plain, 5)))

    def eager():
        with torch.no_grad():
            model(*inputs, use_cache=False)
    rows.append(("PyTorch eager", None, _median_ms(eager, 5)))
    ours_ms = rows[0][2]
    print(f"\n  {'':26s} {'compile':>9s} {'run':>10s} {'run vs ours':>12s}   (compile: until runnable)")
    for name, compile_s, ms in rows:
        c = f"{compile_s:8.1f}s" if compile_s is not None else f"{'-':>9s}"
        print(f"  {name:26s} {c} {ms:8.2f}ms {ms / ours_ms:11.1f}x")
    same = generation(args.checkpoint, tokenizer, args.prompt, args.new_tokens) if args.new_tokens else True
    return 0 if ok and same else 1


def generation(checkpoint, tokenizer, prompt, new_tokens):
    """``compile_causal_lm(checkpoint)``'s greedy text next to transformers' ``generate`` of the
    same checkpoint (both in its stored precision), with the time to the first token and the
    decode rate of each (after one warm-up call each)."""
    from transformers import AutoModelForCausalLM

    from .causal_lm import compile_causal_lm

    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    print(f"\n  generating {new_tokens} tokens after a {ids.shape[1]}-token prompt (greedy), from the "
          "checkpoint directory as stored:")
    t0 = _step("compiling prefill (any prompt length) and decode (one token, states carried)")
    lm = compile_causal_lm(checkpoint)
    lm.module(ids.shape[0])
    _done(t0)
    ours = lm.generate(ids, max_new_tokens=new_tokens)
    ours = lm.generate(ids, max_new_tokens=new_tokens)
    t = lm.last_timings
    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()

    def hf(n):
        with torch.no_grad():
            start = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                 do_sample=False, pad_token_id=tokenizer.eos_token_id)
            return out, time.perf_counter() - start
    hf(2)
    first = hf(1)[1]
    want, total = hf(new_tokens)
    same = torch.equal(ours, want)
    for name, tokens in (("ScanWeaver", ours), ("transformers", want)):
        text = prompt + tokenizer.decode(tokens[0, ids.shape[1]:])
        print(f"\n  {name} ({model.dtype}):\n    " + text.replace("\n", "\n    "))
    if same:
        print("\n  tokens EQUAL to transformers' generate")
    else:
        step, ours_behind, theirs_behind, their_error = _first_difference(model, ours, want)
        same = ours_behind <= their_error
        print(f"\n  tokens equal to transformers' for {step - ids.shape[1]} new tokens; at the next, in a float32 "
              f"run of the same weights ours is {ours_behind:.3f} behind the best, theirs {theirs_behind:.3f}, "
              f"and transformers' own {model.dtype} error there is {their_error:.3f}: "
              + ("a near tie (we accumulate in float32, transformers rounds to bf16 each layer)" if same
                 else "NOT a near tie"))
    hf_rate = (new_tokens - 1) / max(total - first, 1e-9)
    print(f"  {'':26s} {'first token':>12s} {'decode':>14s}")
    print(f"  {'ScanWeaver (TVM + pass)':26s} {1e3 * t.prefill_s:10.1f}ms {t.decode_tokens_per_s:8.1f} tok/s")
    print(f"  {'transformers generate':26s} {1e3 * first:10.1f}ms {hf_rate:8.1f} tok/s")
    return same


def _first_difference(model, ours, want):
    """Where our tokens first differ from transformers': the position, how far each token is
    behind the best logit of a float32 run of the same weights on the prefix both share, and
    transformers' own error there (its logits against that run): a token within that error of
    the best is a tie at the model's precision, not a wrong token."""
    import copy

    step = int((ours[0] != want[0]).nonzero()[0])
    prefix = want[:, :step]
    with torch.no_grad():
        exact = copy.deepcopy(model).float()(prefix).logits[0, -1].double()
        theirs = model(prefix).logits[0, -1].double()
    best = exact.max()
    return (step, float(best - exact[int(ours[0, step])]), float(best - exact[int(want[0, step])]),
            float((theirs - exact).abs().max()))


if __name__ == "__main__":
    sys.exit(main())
