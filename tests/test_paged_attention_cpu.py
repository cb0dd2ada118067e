"""ScanWeaver's CPU kernels for TVM's paged KV cache, against a float64 softmax attention:
the ragged causal prefill (sequences of odd lengths side by side, grouped query heads, fp16
inputs, head sizes 8 to 128) and the decode over pages in a shuffled page table (a partly
filled last page, an empty sequence).  Outputs poisoned with NaN first; ``lse`` in TVM's log2
units."""
import numpy as np
import pytest
import tvm

from scanweaver_core.targets import host_target
from tir_schedules.paged_attention_cpu import EMPTY_LSE, paged_decode, ragged_prefill, replace_cache_kernels

D, PAGE, SCALE = 64, 16, 0.125     # D: the head size of the default case


def _attention(q, k, v, causal, window=0):
    """(out, lse) of softmax(q k^T * SCALE) v per query head; q (n_q, H, d), k/v (n_k, H_kv, d);
    the queries are the last n_q positions (causal), each seeing the last ``window`` keys."""
    n_q, heads, d = q.shape
    n_k, group = k.shape[0], heads // k.shape[1]
    out, lse = np.zeros((n_q, heads, d)), np.full((n_q, heads), EMPTY_LSE)
    if n_k == 0:
        return out, lse
    for h in range(heads):
        s = q[:, h].astype(np.float64) @ k[:, h // group].astype(np.float64).T * SCALE
        at = n_k - n_q + np.arange(n_q)[:, None]        # the queries' positions
        if causal:
            s = np.where(np.arange(n_k)[None, :] <= at, s, -np.inf)
        if window:
            s = np.where(np.arange(n_k)[None, :] > at - window, s, -np.inf)
        top = s.max(1, keepdims=True)
        p = np.exp(s - top)
        out[:, h] = p @ v[:, h // group].astype(np.float64) / p.sum(1, keepdims=True)
        lse[:, h] = (top[:, 0] + np.log(p.sum(1))) / np.log(2)
    return out, lse


def _tensors(*arrays):
    return [tvm.runtime.tensor(np.ascontiguousarray(a), tvm.cpu()) for a in arrays]


@pytest.fixture(scope="module", params=[(2, 8, D, "float32"), (1, 1, D, "float32"), (2, 4, D, "float16"),
                                        (2, 4, 8, "float32"), (1, 2, 48, "float32"), (1, 8, 128, "float32")],
                ids=["gqa4", "mha1", "fp16", "head8", "head48", "gqa8_head128"])
def heads(request):
    kv, q, d, dtype = request.param
    target = host_target()
    return kv, q, d, dtype, tvm.compile(ragged_prefill(kv, q, d, dtype), target=target), \
        tvm.compile(paged_decode(kv, q, d, dtype, PAGE), target=target)


@pytest.mark.parametrize("lengths,causal", [([1], 1), ([2, 3], 1), ([17, 100, 65], 1), ([33, 7], 0), ([130], 1)])
def test_ragged_prefill(heads, lengths, causal):
    kv, qh, d, dtype, prefill, _ = heads
    rng = np.random.default_rng(len(lengths) * 7 + sum(lengths))
    total = sum(lengths)
    q, k, v = (rng.standard_normal((total, h, d)).astype(dtype) for h in (qh, kv, kv))
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype("int32")
    args = _tensors(q, indptr, k, v, indptr, np.zeros(total, "int32"), np.zeros(len(lengths), "int32"),
                    np.full((total, qh, d), np.nan, dtype), np.full((total, qh), np.nan, "float32"))
    prefill(*args, causal, 0, 1.0, 1e4, SCALE)
    tol = 2e-3 if dtype == "float16" else 1e-5
    for a, b in zip(indptr[:-1], indptr[1:]):
        out, lse = _attention(q[a:b], k[a:b], v[a:b], causal)
        np.testing.assert_allclose(args[7].numpy()[a:b].astype(np.float64), out, atol=tol, rtol=tol)
        np.testing.assert_allclose(args[8].numpy()[a:b], lse, atol=tol, rtol=tol)


@pytest.mark.parametrize("lengths", [[1], [16], [17, 3], [100, 0, 33], [4099]])
def test_paged_decode(heads, lengths):
    kv, qh, d, dtype, _, decode = heads
    rng = np.random.default_rng(sum(lengths) + 1)
    q, args, kvs = _decode_inputs(rng, lengths, kv, qh, d, dtype)
    decode(*args, 0, 1.0, 1e4, SCALE)
    tol = 2e-3 if dtype == "float16" else 1e-5
    for b, (k, v) in enumerate(kvs):
        out, lse = _attention(q[b:b + 1], k, v, causal=False)
        np.testing.assert_allclose(args[7].numpy()[b:b + 1].astype(np.float64), out, atol=tol, rtol=tol)
        np.testing.assert_allclose(args[8].numpy()[b:b + 1], lse, atol=tol, rtol=tol)


def _decode_inputs(rng, lengths, kv, qh, d, dtype):
    """A decode's arguments (pages in a shuffled table, outputs NaN), and each sequence's keys
    and values in order."""
    pages_of = [-(-n // PAGE) for n in lengths]
    pool = sum(pages_of) + 5
    pages = rng.standard_normal((pool, 2, kv, PAGE, d)).astype(dtype)
    table = rng.permutation(pool)[:sum(pages_of)].astype("int32")       # pages anywhere in the pool
    indptr = np.concatenate([[0], np.cumsum(pages_of)]).astype("int32")
    last = np.array([n - (p - 1) * PAGE if n else 0 for n, p in zip(lengths, pages_of)], "int32")
    q = rng.standard_normal((len(lengths), qh, d)).astype(dtype)
    args = _tensors(q, pages, indptr, table, last, np.zeros(len(lengths), "int32"), np.zeros(len(lengths), "int32"),
                    np.full((len(lengths), qh, d), np.nan, dtype), np.full((len(lengths), qh), np.nan, "float32"))
    kvs = []
    for b, n in enumerate(lengths):
        mine = pages[table[indptr[b]:indptr[b + 1]]]                   # (pages, 2, kv, PAGE, D)
        kvs.append([mine[:, i].transpose(0, 2, 1, 3).reshape(-1, kv, d)[:n] for i in (0, 1)])
    return q, args, kvs


@pytest.fixture(scope="module", params=[(2, 8, 20), (1, 2, 64)], ids=["gqa4_w20", "gqa2_w64"])
def windowed(request):
    """Kernels for sliding-window attention (RecurrentGemma's local attention): windows
    shorter than a key block of the prefill (64), and one as long."""
    kv, qh, window = request.param
    target = host_target()
    return kv, qh, window, tvm.compile(ragged_prefill(kv, qh, D, "float32", window=window), target=target), \
        tvm.compile(paged_decode(kv, qh, D, "float32", PAGE, window), target=target)


@pytest.mark.parametrize("lengths", [[1, 19], [20, 21], [17, 100, 65], [130], [300]])
def test_ragged_prefill_sliding_window(windowed, lengths):
    kv, qh, window, prefill, _ = windowed
    rng = np.random.default_rng(sum(lengths) + window)
    total = sum(lengths)
    q, k, v = (rng.standard_normal((total, h, D)).astype("float32") for h in (qh, kv, kv))
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype("int32")
    args = _tensors(q, indptr, k, v, indptr, np.zeros(total, "int32"), np.zeros(len(lengths), "int32"),
                    np.full((total, qh, D), np.nan, "float32"), np.full((total, qh), np.nan, "float32"))
    prefill(*args, 1, 0, 1.0, 1e4, SCALE)
    for a, b in zip(indptr[:-1], indptr[1:]):
        out, lse = _attention(q[a:b], k[a:b], v[a:b], causal=True, window=window)
        np.testing.assert_allclose(args[7].numpy()[a:b], out, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(args[8].numpy()[a:b], lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("lengths", [[1], [20, 21], [64, 65], [100, 0, 33], [4099]])
def test_paged_decode_sliding_window(windowed, lengths):
    kv, qh, window, _, decode = windowed
    rng = np.random.default_rng(sum(lengths) + 2 * window)
    q, args, kvs = _decode_inputs(rng, lengths, kv, qh, D, "float32")
    decode(*args, 0, 1.0, 1e4, SCALE)
    for b, (k, v) in enumerate(kvs):
        out, lse = _attention(q[b:b + 1], k, v, causal=True, window=window)
        np.testing.assert_allclose(args[7].numpy()[b:b + 1], out, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(args[8].numpy()[b:b + 1], lse, atol=1e-5, rtol=1e-5)


def test_rotary_embedding_is_refused(heads):
    kv, qh, d, dtype, prefill, _ = heads
    args = _tensors(np.zeros((1, qh, d), dtype), np.array([0, 1], "int32"), np.zeros((1, kv, d), dtype),
                    np.zeros((1, kv, d), dtype), np.array([0, 1], "int32"), np.zeros(1, "int32"),
                    np.zeros(1, "int32"), np.zeros((1, qh, d), dtype), np.zeros((1, qh), "float32"))
    with pytest.raises(Exception, match="no rotary embedding"):
        prefill(*args, 1, 1, 1.0, 1e4, SCALE)


def test_replace_cache_kernels():
    """Our two kernels take the names of TVM's; the cache's other kernels are marked noalias
    (TVM 0.27's LLVM codegen otherwise lets their missing attribute strip it from the parallel
    bodies of other functions: accumulators spilled on every step, the model's matmuls too)."""
    from tvm import relax
    from tvm.relax.frontend.nn.llm.kv_cache import _attention_decode_cpu, _attention_prefill_ragged_cpu, \
        _merge_state_inplace_cpu

    bb = relax.BlockBuilder()
    bb.add_func(_attention_prefill_ragged_cpu(2, 8, D, D, "float32", {}), "tir_attention_prefill_ragged_cpu")
    bb.add_func(_attention_decode_cpu(2, 8, D, "float32", False, {}), "tir_attention_decode_cpu")
    bb.add_func(_merge_state_inplace_cpu("float32"), "tir_attention_merge_state_cpu")
    mod = replace_cache_kernels(bb.get(), 2, 8, D, "float32", PAGE)
    funcs = {gv.name_hint: f for gv, f in mod.functions_items()}
    for name, kernel in (("tir_attention_prefill_ragged_cpu", ragged_prefill(2, 8, D, "float32")),
                         ("tir_attention_decode_cpu", paged_decode(2, 8, D, "float32", PAGE))):
        tvm.ir.assert_structural_equal(funcs[name], kernel.with_attr("global_symbol", name))
    assert all(bool(f.attrs["tirx.noalias"]) for f in funcs.values())
