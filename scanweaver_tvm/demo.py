"""``make demo``: the main job end to end on Hugging Face's ``MambaForCausalLM``.

    python -m scanweaver_tvm.demo [--length 256] [--layers 2] [--no-baseline] [--new-tokens 32]

Builds ``transformers.MambaForCausalLM`` from a tiny random config (no download: the model as
users have it, small), imports it with ``sw.from_torch(model, (input_ids,))``, prints what the
pass finds (one selective scan per layer), compiles it for this CPU with ScanWeaver, checks
the logits against PyTorch, and times compile and run next to TVM without the pass (the
unrolled loop) and PyTorch eager, all measured in this run.  Then it generates from the same
prompt with ``compile_causal_lm`` (prefill + decode, states carried) and shows the tokens equal
to transformers' ``generate``, with the time to the first token and the decode rate of both.
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


def hf_mamba(length, layers):
    """A tiny random ``MambaForCausalLM`` (d_model 64, d_inner 128, N 16, vocabulary 1024)
    and a batch of one prompt of ``length`` tokens."""
    from transformers import MambaConfig, MambaForCausalLM

    torch.manual_seed(0)
    config = MambaConfig(vocab_size=1024, hidden_size=64, state_size=16, num_hidden_layers=layers,
                         expand=2)
    model = MambaForCausalLM(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, length), generator=torch.Generator().manual_seed(1))
    return model, [ids]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=256, help="prompt length L (default 256)")
    parser.add_argument("--layers", type=int, default=2, help="Mamba layers (default 2)")
    parser.add_argument("--no-baseline", action="store_true", help="skip compiling TVM without the pass")
    parser.add_argument("--new-tokens", type=int, default=32,
                        help="tokens to generate after the prompt, next to transformers (0 skips)")
    args = parser.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    model, inputs = hf_mamba(args.length, args.layers)
    print(f"ScanWeaver-TVM demo: transformers {_version('transformers')} MambaForCausalLM "
          f"({args.layers} layers, tiny random config), input_ids {tuple(inputs[0].shape)}, "
          f"TVM {tvm.__version__}, target {api._target('llvm')}")
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
    same = generation(model, inputs[0], args.new_tokens) if args.new_tokens else True
    return 0 if ok and same else 1


def generation(model, ids, new_tokens):
    """``compile_causal_lm``'s greedy tokens next to transformers' ``generate``, with the time
    to the first token and the decode rate of each (after one warm-up call each)."""
    from .causal_lm import compile_causal_lm

    print(f"\n  generating {new_tokens} tokens after the {ids.shape[1]}-token prompt (greedy):")
    t0 = _step("compiling prefill (any prompt length) and decode (one token, states carried)")
    lm = compile_causal_lm(model)
    lm.module(ids.shape[0])
    _done(t0)
    ours = lm.generate(ids, max_new_tokens=new_tokens)
    ours = lm.generate(ids, max_new_tokens=new_tokens)
    t = lm.last_timings

    def hf(n):
        with torch.no_grad():
            start = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)
            return out, time.perf_counter() - start
    hf(2)
    first = hf(1)[1]
    want, total = hf(new_tokens)
    same = torch.equal(ours, want)
    print(f"  tokens {'equal to' if same else 'DIFFER from'} transformers' generate: {ours[0, ids.shape[1]:].tolist()}")
    hf_rate = (new_tokens - 1) / max(total - first, 1e-9)
    print(f"  {'':26s} {'first token':>12s} {'decode':>14s}")
    print(f"  {'ScanWeaver (TVM + pass)':26s} {1e3 * t.prefill_s:10.1f}ms {t.decode_tokens_per_s:8.1f} tok/s")
    print(f"  {'transformers generate':26s} {1e3 * first:10.1f}ms {hf_rate:8.1f} tok/s")
    return same


if __name__ == "__main__":
    sys.exit(main())
