"""Generation on the CPU: ``sw.compile_causal_lm`` (prefill + decode, states carried) next to
transformers' ``generate`` (eager, its own cache), measured in one run.

    python -m bench.generate [--model mamba|qwen3_5] [--layers 4] [--prompt 512] [--new 64] [--rounds 3]
                             [--scaling 256,1024,4096] [--dtype float32] [--weights int8|int4|...]
                             [--hidden 768] [--vocab 50280] [--out bench/out_generate]

The shape: HF ``MambaForCausalLM`` at the real width (hidden 768, d_inner 1536, N 16,
vocabulary 50280, random weights; ``--layers``, ``--hidden``, ``--vocab`` change it), or
``--model qwen3_5``: transformers' ``Qwen3_5ForCausalLM`` at a real width (the prefill bench's:
hidden 1024, 3 Gated DeltaNet layers + 1 gated-attention layer, MLP 3072, vocabulary 50280);
batch 1, a prompt of ``--prompt`` tokens and ``--new`` new
tokens, greedy.  Reported (medians of interleaved rounds): time to the first token (ours: one
prefill call; transformers: ``generate(max_new_tokens=1)``), decode tokens/s (ours: the decode
steps of ``generate``; transformers: (time for ``--new`` tokens - time for 1) / (new - 1)), and
the bandwidth floor of a decode step: the bytes of the weights read once per token divided by
the copy bandwidth measured here (numpy copy of 256 MB, best of 5, in every round next to our
decode; the best round's).  The tokens are checked equal.  ``--dtype bfloat16``: the model
cast to bf16 as a bf16 checkpoint loads (ours and transformers both run it as given: bf16
weights, float32 states and accumulators; the floor counts its bf16 bytes), next to our float32
build of the same weights in the same rounds.  ``--weights int8`` (or ``int4``, any format of
``scanweaver_core.weight_formats``): ours with its dense weights quantized
(``compile_causal_lm(weights=)``; the floor counts each weight's bytes in its format, scales
included; tokens may differ from transformers', which runs the model as given), next to our
float32 and bf16 builds and OpenVINO with NNCF's compression in the same format (its first
token, and a one-token forward for its decode), same rounds.  OpenVINO's first token
(``ov.convert_model`` of the float32 model; its default precision, bf16 on AVX512-BF16 / AMX
CPUs, and f32) is timed in the same rounds too.  ``--scaling``: our prefill's cost per prompt
token at each of those lengths (one executable, medians of ``--rounds``), the last against the
first (the target: flat in L).
Writes ``generate.json`` / ``.md`` into ``--out``.
"""
import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import outputs

PAUSE_S = 0.05      # between two paths: TVM's pool spins its workers a few ms after a call (its
#                     default, as users run it), OpenVINO's TBB its own; the next path starts idle


def copy_bandwidth(mb=256, repeats=5):
    """Bytes/s of a numpy copy (read + write counted once each: 2 x size per copy)."""
    src = np.ones(mb * (1 << 20) // 8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.nbytes / best


def weight_bytes(model, weights=None):
    """Bytes read per decode token: every parameter once (tied lm head and embedding once; the
    embedding row itself is one row, counted with the head).  ``weights``: a weight format
    (``int8``, ``int4_g32``, ...): every 2-D weight in its bytes (the head's, vocabulary
    wide, in the format's head format)."""
    from scanweaver_core.weight_formats import weight_format

    fmt = weight_format(weights) if weights else None
    table = model.get_input_embeddings().weight.shape       # (the logits layer's shape too)
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        layer = fmt and p.dim() == 2 and (fmt.head_format() if p.shape == table else fmt)
        if layer:
            total += layer.nbytes(p.shape[1], p.shape[0])
        else:
            total += p.numel() * p.element_size()
    return total


def first_difference(model, ours, want):
    """Where our greedy tokens ``ours`` first differ from transformers' ``want`` (None where
    they do not): the position, both tokens, how far each is behind the best logit of an
    float32 run of the same weights on the prefix both agree on, and transformers' own error
    there (its logits against that run, the max over the vocabulary).  A token within that
    error of the best is a near tie at the model's precision, not a wrong token."""
    import copy

    import torch

    differ = (ours[0] != want[0]).nonzero()
    if not len(differ):
        return None
    step = int(differ[0])
    prefix = want[:, :step]
    from scanweaver_tvm.causal_lm import torch_kernels

    with torch.no_grad(), torch_kernels():
        exact = copy.deepcopy(model).float()(prefix).logits[0, -1].double().numpy()
        theirs = model(prefix).logits[0, -1].double().numpy()
    ours_token, their_token = int(ours[0, step]), int(want[0, step])
    return {"position": step, "ours": ours_token, "theirs": their_token,
            "ours_behind": float(exact.max() - exact[ours_token]),
            "theirs_behind": float(exact.max() - exact[their_token]),
            "their_error": float(np.abs(theirs - exact).max())}


def _measure_ours(lm, ids, new, bandwidth=False):
    """One ``generate``: seconds to the first token, decode tokens/s (and the copy bandwidth
    measured right after, next to our decode)."""
    lm.generate(ids, max_new_tokens=new)
    t = lm.last_timings
    return {"ttft": t.prefill_s, "decode": t.decode_tokens_per_s, **({"bandwidth": copy_bandwidth()} if bandwidth else {})}


@dataclass
class Peer:
    """A path timed in the same rounds: its table label and a function returning its timings."""
    label: str
    measure: Callable[[], dict]


def _peers(model, ids, new, weights=None):
    """Our float32 build of the same weights (for a bf16 model, or ours with ``weights``), and
    OpenVINO's first token (``ov.convert_model`` of the float32 model's last logits) at its
    default precision and at f32 (a failed conversion is said in the label); name -> ``Peer``."""
    import copy

    import torch

    import scanweaver_tvm as sw
    from scanweaver_core.weight_formats import weight_format

    from .models_zoo import logits_module
    from .openvino_cpu import compile_openvino

    fp32 = copy.deepcopy(model).float() if model.dtype != torch.float32 else model
    peers = {}
    if fp32 is not model or weights:
        lm32 = sw.compile_causal_lm(fp32)
        lm32.module()
        peers["ours_f32"] = Peer("ours, float32 weights", lambda: _measure_ours(lm32, ids, new))
    if weights:                 # (the precision a quantized build's first token must not lose to)
        lm16 = sw.compile_causal_lm(copy.deepcopy(fp32).to(torch.bfloat16))
        lm16.module()
        peers["ours_bf16"] = Peer("ours, bfloat16 weights", lambda: _measure_ours(lm16, ids, new))
    if weights and _has_bf16_dot():   # (the same format, the prefill's activations in bf16: asked for)
        lmq = sw.compile_causal_lm(model, weights=weight_format(weights, activations="bfloat16"))
        lmq.module()
        peers["ours_bf16_prefill"] = Peer(f"ours, {weights} weights, bf16 prefill activations (asked for)",
                                          lambda: _measure_ours(lmq, ids, new))

    last = logits_module(fp32, last=True)
    for hint, (run, precision) in compile_openvino(last, (ids,), (None, "f32")).items():
        label = f"OpenVINO {precision}" + (" (its default)" if hint is None else "") + ", first token only"
        print(label, flush=True)
        peers[f"openvino_{hint or 'default'}"] = Peer(label, (lambda run=run: {"ttft": _seconds(run)}) if run else None)
    if weights:                 # NNCF's compression of the same format: its first token, and a
        (first, precision), (step, _) = (compile_openvino(last, (x,), (None,), weights)[None]   # one-token
                                         for x in (ids, ids[:, :1]))                           # forward
        label = f"OpenVINO {precision}, NNCF {weights}, first token; decode: a one-token forward (stateless)"
        print(label, flush=True)

        def compressed():
            return {"ttft": _seconds(first), "decode": _per_second(step)}

        peers["openvino_compressed"] = Peer(label, compressed if first and step else None)
    return peers


def _per_second(fn, n=16):
    """Calls of ``fn`` a second, over ``n`` calls."""
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - start)


def _seconds(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def prefill_scaling(lm, lengths, rounds, vocab):
    """Our prefill's microseconds per prompt token at each length (median of ``rounds``)."""
    out = {}
    for n in lengths:
        ids = np.random.default_rng(n).integers(0, vocab, (1, n))
        lm.prefill(ids)
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            lm.prefill(ids)
            times.append(time.perf_counter() - start)
        out[n] = 1e6 * statistics.median(times) / n
    return out


def main(argv=None):
    import torch
    import transformers

    import scanweaver_tvm as sw
    from scanweaver_tvm.causal_lm import torch_kernels

    from .scan import _machine

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mamba", choices=["mamba", "qwen3_5"])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--scaling", default="256,1024,4096", help="prompt lengths of the prefill scaling ('' skips)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--weights", default=None,
                   help="our weights' format (sw.compile_causal_lm's weights=); transformers runs the model as given")
    p.add_argument("--hidden", type=int, default=768, help="hidden size (the real width's; smaller for a smoke run)")
    p.add_argument("--vocab", type=int, default=50280)
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "out_generate"))
    args = p.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    if args.model == "qwen3_5":
        from .prefill_kernels import model_of

        model = model_of("qwen3_5")
        about = "Qwen3.5 (hidden 1024, 3 Gated DeltaNet + 1 attention layer, vocab 50280)"
    else:
        model = transformers.MambaForCausalLM(transformers.MambaConfig(
            vocab_size=args.vocab, hidden_size=args.hidden, state_size=16, num_hidden_layers=args.layers, expand=2))
        about = f"HF Mamba ({args.layers} layers, hidden {args.hidden}, vocab {args.vocab})"
    model = model.to(getattr(torch, args.dtype)).eval()
    cfg = model.config
    ids = torch.randint(0, cfg.vocab_size, (1, args.prompt), generator=torch.Generator().manual_seed(1))
    start = time.perf_counter()
    lm = sw.compile_causal_lm(model, weights=args.weights)
    lm.module()
    compile_s = time.perf_counter() - start
    print(f"compiled in {compile_s:.1f} s", flush=True)

    def hf(n):                  # (transformers' torch path: fla's Triton kernels need a GPU)
        with torch.no_grad(), torch_kernels():
            start = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)
            return out, time.perf_counter() - start
    ours = lm.generate(ids, max_new_tokens=args.new)
    want, _ = hf(args.new)
    same = torch.equal(ours, want)
    difference = None if same else first_difference(model, ours, want)
    near_tie = difference is not None and difference["ours_behind"] <= difference["their_error"]
    peers = _peers(model, ids, args.new, args.weights)
    measure = {"ours": lambda: _measure_ours(lm, ids, args.new, bandwidth=True),
               "hf": lambda: {"ttft": hf(1)[1], "total": hf(args.new)[1]},
               **{name: peer.measure for name, peer in peers.items() if peer.measure}}
    rows = {}
    for i in range(args.rounds):
        names = list(measure)
        for name in names[i % len(names):] + names[:i % len(names)]:   # (interleaved, order rotated)
            time.sleep(PAUSE_S)
            for kind, value in measure[name]().items():
                rows.setdefault(f"{name}_{kind}", []).append(value)
    med = {k: statistics.median(v) for k, v in rows.items()}
    scaling = prefill_scaling(lm, [int(n) for n in args.scaling.split(",") if n], args.rounds, cfg.vocab_size)
    hf_decode = (args.new - 1) / max(med["hf_total"] - med["hf_ttft"], 1e-9)
    bandwidth = max(rows["ours_bandwidth"])      # the best the machine gave: the strictest floor
    floor_s = weight_bytes(model, args.weights) / bandwidth
    result = {"machine": _machine(), "model": about, "dtype": args.dtype, "layers": args.layers, "prompt": args.prompt, "new": args.new,
              "compile_s": compile_s, "tokens_equal": same, "first_difference": difference, "rounds": rows, "medians": med,
              "tvm_thread_pool_spin_count": os.environ.get("TVM_THREAD_POOL_SPIN_COUNT", "TVM's default"),
              "hf_decode_tokens_per_s": hf_decode, "copy_bandwidth_GBps": bandwidth / 1e9,
              "weights": args.weights, "weight_MB": weight_bytes(model, args.weights) / 1e6, "floor_ms_per_token": 1e3 * floor_s,
              "prefill_us_per_token": scaling, "peers": {name: peer.label for name, peer in peers.items()}}
    ours_step = 1e3 / med["ours_decode"]
    lines = [f"# Generation, {about}, {args.dtype}" + (f", our weights {args.weights}" if args.weights else "") + ", CPU", "",
             f"{result['machine']['cpu']}, {result['machine']['cores']} cores; prompt {args.prompt} tokens, "
             f"{args.new} new, greedy, batch 1; medians of {args.rounds} interleaved rounds; tokens equal: {same}"
             + ("." if same else _difference_text(difference, near_tie))
             + f" TVM's thread pool spin count: {result['tvm_thread_pool_spin_count']}.",
             "", "| | first token ms | decode tokens/s | decode ms/token |", "|---|---|---|---|",
             f"| ours (compile_causal_lm) | {1e3 * med['ours_ttft']:.1f} | {med['ours_decode']:.1f} | {ours_step:.2f} |",
             f"| transformers generate | {1e3 * med['hf_ttft']:.1f} | {hf_decode:.1f} | {1e3 / hf_decode:.2f} |",
             f"| ratio (ours / transformers) | {med['hf_ttft'] / med['ours_ttft']:.2f}x faster | "
             f"{med['ours_decode'] / hf_decode:.2f}x | |",
             *(_peer_row(peer.label, name, med) for name, peer in peers.items()), "",
             *_peer_ratios(med),
             f"Bandwidth floor: {result['weight_MB']:.0f} MB of weights per token at {bandwidth / 1e9:.1f} GB/s "
             f"(numpy copy, best of the rounds) = {1e3 * floor_s:.2f} ms/token; ours is {ours_step / (1e3 * floor_s):.2f}x the floor. "
             f"Compile (prefill + decode): {compile_s:.0f} s."]
    if scaling:
        first, last = min(scaling), max(scaling)
        lines += ["", "Prefill cost per prompt token (ours, one executable): " + ", ".join(
            f"{n}: {us:.0f} us" for n, us in sorted(scaling.items()))
            + f"; {last} against {first}: {scaling[last] / scaling[first]:.2f}x."]
    print("\n".join(lines))
    name = "_".join(["generate"] + [x for x in (args.model if args.model != "mamba" else None, args.dtype if args.dtype != "float32" else None, args.weights) if x])
    outputs.write(args.out, name, result, "\n".join(lines) + "\n")
    return 0 if same or near_tie or args.weights else 1   # (quantized weights: tokens may differ)


def _peer_row(label, name, med):
    ttft, decode = med.get(f"{name}_ttft"), med.get(f"{name}_decode")
    return (f"| {label} | " + (f"{1e3 * ttft:.1f}" if ttft else "-") + " | "
            + (f"{decode:.1f} | {1e3 / decode:.2f} |" if decode else "- | - |"))


def _has_bf16_dot():
    """This CPU multiplies bf16 pairs (AVX512-BF16): a quantized build's bf16 prefill runs."""
    from scanweaver_core.targets import host_target
    from tir_schedules import bf16_dot

    return bf16_dot.available(host_target())


def _peer_ratios(med):
    """Our first token against OpenVINO's, and our decode against our float32 build's."""
    out = [f"Our first token is {med[key] / med['ours_ttft']:.2f}x faster than OpenVINO's {hint}."
           for hint, key in (("default", "openvino_default_ttft"), ("f32", "openvino_f32_ttft")) if key in med]
    if "openvino_compressed_decode" in med:
        out.append(f"Our decode is {med['ours_decode'] / med['openvino_compressed_decode']:.2f}x OpenVINO's one-token "
                   "forward with the same compression.")
    if "ours_bf16_prefill_ttft" in med and "ours_bf16_ttft" in med:
        out.append(f"With bf16 prefill activations our first token is {med['ours_bf16_prefill_ttft'] * 1e3:.1f} ms, "
                   f"{med['ours_bf16_ttft'] / med['ours_bf16_prefill_ttft']:.2f}x our bf16 build's speed.")
    if "ours_f32_decode" in med:
        out.append(f"Our decode is {med['ours_decode'] / med['ours_f32_decode']:.2f}x our float32 build's "
                   "(the same weights in float32), in the same rounds.")
    return [" ".join(out)] if out else []


def _difference_text(d, near_tie):
    return (f" (first at position {d['position']}: ours {d['ours']}, transformers' {d['theirs']}; against a "
            f"float32 run of the same weights ours is {d['ours_behind']:.3f} behind the best, theirs "
            f"{d['theirs_behind']:.3f}, transformers' own error there {d['their_error']:.3f}: "
            + ("a near tie)." if near_tie else "not a near tie)."))


if __name__ == "__main__":
    sys.exit(main())
