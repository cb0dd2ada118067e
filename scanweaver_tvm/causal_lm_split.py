"""A prompt prefilled across ranks, the host's side (``compile_causal_lm(..., ranks=N)``).

Each rank calls the compiled ``prefill_split`` on its consecutive part of the prompt
(``relax_pass.split.sequence``); the module's all-gathers meet the other ranks' through the
extern ``scanweaver.ccl.allgather`` (``sequence_parallel.collective``).  With attention
layers (a hybrid) the host first all-gathers the parts' lengths through the same extern (each
rank then knows where its positions start and how long the longest part is), and the last rank
puts the gathered keys and values, the whole prompt's, into a paged KV cache through TVM's
checkpoint import (``KVCache.load_prompt``), so decode runs there as after a whole prefill.

``check`` validates the split at compile time: a probe prompt over the ranks run as threads
must leave the last rank with the whole prefill's logits and states, and one decode step from
there must give the same logits."""
import numpy as np

from relax_pass.split.sequence import SplitRefused
from scanweaver_core.sequence_parts import split


def _part_lengths(length, world):
    """Every rank's part length, in rank order (one small all-gather)."""
    import tvm

    from relax_pass.split.scan import ALLGATHER

    recv = tvm.runtime.empty((world,), "int64")
    tvm.get_global_func(ALLGATHER)(tvm.runtime.tensor(np.array([length], dtype=np.int64)), recv)
    return recv.numpy()


def run_part(lm, vm, ids, rank, max_length=None):
    """``(logits, states)`` of rank ``rank``'s part ``ids`` through ``vm``'s ``prefill_split``.
    With a paged cache, ``states[0]`` is, on the last rank, a cache holding the whole prompt
    (room for ``max_length`` tokens a sequence), elsewhere None."""
    import tvm
    import tvm_ffi

    from .causal_lm import ROOM
    from .paged_attention import KVCache

    ranks, spec = lm.ranks, lm.layout.paged
    batch, length = ids.shape
    args = [tvm.runtime.tensor(ids), tvm.runtime.tensor(np.array(rank, dtype=np.int64))]
    if spec:
        lengths = _part_lengths(length, ranks)
        positions = np.broadcast_to(lengths[:rank].sum() + np.arange(length, dtype=np.int64), ids.shape)
        args = [args[0], tvm.runtime.tensor(np.ascontiguousarray(positions)), args[1],
                tvm.runtime.tensor(lengths), tvm_ffi.Shape([int(lengths.max())])]
    out = list(vm["prefill_split"](*args))
    if not spec:
        return out[0], out[1:]
    kv = out[len(out) - 2 * len(spec.layers):]
    states = out[1:len(out) - len(kv)]
    if rank != ranks - 1:
        return out[0], [None] + states
    total = int(lengths.sum())
    cache = KVCache(vm, batch, max_length or total + ROOM, batch)
    whole = [np.concatenate([x.numpy()[p, :, :n] for p, n in enumerate(lengths)], axis=1) for x in kv]
    cache.load_prompt(whole[0::2], whole[1::2])
    return out[0], [cache] + states


def check(lm, batch):
    """Raise ``SplitRefused`` unless ``prefill_split`` over the ranks (as threads) leaves the
    last rank with the whole prefill's logits and states, and a decode step from each agrees
    (a model that reads across positions in a way the split does not carry, RWKV's token
    shift say, is refused here rather than served wrong)."""
    from .sequence_parallel.collective import in_threads

    ranks = lm.ranks
    ids = np.random.default_rng(0).integers(0, lm.config.vocab_size, (batch, ranks * max(lm.shortest_prompt, 4) + 1))
    bounds = split(ids.shape[1], ranks)

    def part(rank):
        start, stop = bounds[rank]
        return run_part(lm, lm._vm(batch), np.ascontiguousarray(ids[:, start:stop]), rank)

    got = in_threads(ranks, part)[-1]
    want = lm.prefill(ids)
    # (a model computing in bf16 or fp16 sums in another order over parts: its rounding)
    tolerance = 1e-4 if str(getattr(lm.model, "dtype", "float32")).endswith("float32") else 3e-2
    _compare(ranks, tolerance, "logits", got[0], want[0])
    first = 1 if lm.layout.paged else 0
    for i, (g, w) in enumerate(zip(got[1][first:], want[1][first:])):
        _compare(ranks, tolerance, f"state {i}", g, w)
    token = want[0].numpy().argmax(-1)
    _compare(ranks, tolerance, "logits of a decode step after it", lm.decode(token, got[1])[0],
             lm.decode(token, want[1])[0])


def _compare(ranks, tolerance, what, got, want):
    got, want = got.numpy().astype(np.float64), want.numpy().astype(np.float64)
    scale = max(float(np.abs(want).max()), 1.0)
    err = float(np.abs(got - want).max()) / scale
    if not err <= tolerance:
        raise SplitRefused(f"ranks={ranks}: the split prefill's {what} differ from the whole prefill's by {err:.2g} "
                           "of their scale on a probe prompt: the model reads across positions in a way the "
                           "split does not carry (only fused scans, causal depthwise convs and attention in the "
                           "paged cache are split)")
