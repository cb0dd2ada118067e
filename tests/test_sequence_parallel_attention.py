"""A hybrid's attention layer split across ranks (``relax_pass.split.attention``): each rank's
queries over the all-gathered keys and values, masked by position, against causal attention
over the whole sequence in float64 (grouped queries, a value head size unlike the keys', parts
of unequal length, one to four ranks as threads).  The bytes each rank sends equal the cost
model's ``attention_bytes``; what the split does not carry is refused by name."""
import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from relax_pass.split.attention import PLACEHOLDER
from relax_pass.split.sequence import SplitRefused, split_prefill
from scanweaver_core.sequence_parts import split
from scanweaver_tvm.causal_lm_split import _part_lengths
from scanweaver_tvm.sequence_parallel import collective, cost

B, HQ, HKV, D, DV = 2, 4, 2, 8, 6
SCALE = 0.3
F32 = "float32"


def _prefill(window=0):
    """``main(q, k, v, position_ids) -> (attention,)``: one placeholder attention call, as a
    hybrid's prefill holds one an attention layer."""
    length = tirx.Var("L", "int64")
    q, k, v = (relax.Var(n, relax.TensorType([B, length, h, d], F32))
               for n, h, d in (("q", HQ, D), ("k", HKV, D), ("v", HKV, DV)))
    positions = relax.Var("position_ids", relax.TensorType([B, length], "int64"))
    bb = relax.BlockBuilder()
    with bb.function("main", [q, k, v, positions]):
        with bb.dataflow():
            out = bb.emit(relax.call_dps_packed(
                relax.ExternFunc(PLACEHOLDER), [relax.prim_value(3), relax.prim_value(SCALE), relax.prim_value(window),
                                                q, k, v], out_ty=relax.TensorType([B, length, HQ, DV], F32)))
            result = bb.emit_output(relax.Tuple([out]))
        bb.emit_func_output(result)
    return bb.get()["main"], length


def _causal_attention(q, k, v):
    """float64 reference: (B, n, HQ, D) queries over keys at or before their position."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    k, v = (np.repeat(x, HQ // HKV, axis=2) for x in (k, v))
    scores = np.einsum("bihd,bjhd->bhij", q, k) * SCALE
    n = q.shape[1]
    scores = np.where(np.tril(np.ones((n, n), dtype=bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bhij,bjhd->bihd", weights, v)


@pytest.mark.parametrize("ranks,length", [(1, 5), (2, 9), (3, 7), (4, 23)])
def test_split_attention_equals_causal_attention_over_the_whole_sequence(ranks, length):
    func, var = _prefill()
    exe = tvm.compile(tvm.IRModule({"main": split_prefill(func, ranks, var, positions_at=3)}), "llvm")
    rng = np.random.default_rng(length)
    q, k, v = (rng.standard_normal((B, length, h, d)).astype(np.float32)
               for h, d in ((HQ, D), (HKV, D), (HKV, DV)))
    bounds = split(length, ranks)

    def part(rank):
        start, stop = bounds[rank]
        lengths = _part_lengths(stop - start, ranks)
        positions = np.broadcast_to(np.arange(start, stop, dtype=np.int64), (B, stop - start))
        args = [np.ascontiguousarray(x[:, start:stop]) for x in (q, k, v)] + [np.ascontiguousarray(positions)]
        vm = relax.VirtualMachine(exe, tvm.cpu())
        out = vm["main"](*[tvm.runtime.tensor(x) for x in args], tvm.runtime.tensor(np.array(rank, dtype=np.int64)),
                         tvm.runtime.tensor(lengths), tvm.runtime.ShapeTuple([int(lengths.max())]))
        return [x.numpy() for x in out], lengths

    traffic = [collective.Traffic() for _ in range(ranks)]
    results = collective.in_threads(ranks, part, traffic=traffic)
    got = np.concatenate([out[0] for out, _ in results], axis=1)
    want = _causal_attention(q, k, v)
    assert np.abs(got - want).max() <= 1e-5 * max(np.abs(want).max(), 1.0)
    (_, keys, values), lengths = results[-1]
    for gathered, whole in ((keys, k), (values, v)):      # the last rank's: the whole prompt's
        assert np.array_equal(np.concatenate([gathered[p, :, :n] for p, n in enumerate(lengths)], axis=1), whole)
    longest = -(-length // ranks)
    for sent in traffic:     # the lengths (8 bytes), then the layer's keys and values
        assert (sent.calls, sent.bytes_sent) == (2, 8 + cost.attention_bytes(B, longest, HKV, D, DV))


def test_a_sliding_window_and_missing_positions_are_refused_by_name():
    func, var = _prefill(window=4)
    with pytest.raises(SplitRefused, match="attention layer 3 with a sliding window"):
        split_prefill(func, 2, var, positions_at=3)
    func, var = _prefill()
    with pytest.raises(SplitRefused, match="attention layer 3 with no position_ids"):
        split_prefill(func, 2, var)
