"""xLSTM's chunkwise mLSTM (``relax_pass/forms/mlstm/mlstm_chunked.py``): HF's
``mlstm_chunkwise_native_autograd`` as a user's model runs it, read as one mLSTM scan."""
import numpy as np
import pytest
import torch
from transformers.models.xlstm import modeling_xlstm as mx

import scanweaver_tvm as sw
from relax_pass.fuse import fuse
from tests.harness import assert_outputs_match, run_model
from tests.test_mlstm import Fn, _inputs, xlstm  # noqa: F401 (xlstm: the tiny HF model, a fixture)


def chunkwise(chunk, states=False):
    """HF's chunkwise kernel on whole chunks; with ``states``, initial states in, final out."""
    def run(q, k, v, i, f, *h0):
        if not states:
            return mx.mlstm_chunkwise_native_autograd(q, k, v, i, f, chunk_size=chunk)
        h, (c, n, m) = mx.mlstm_chunkwise_native_autograd(q, k, v, i, f, *h0, return_last_states=True,
                                                          chunk_size=chunk)
        return h, c, n, m
    return Fn(run)


def _states(b, h, key, value, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, key, value, generator=g), torch.randn(b, h, key, generator=g),
            torch.randn(b, h, 1, generator=g))


def _expect_one_scan(model, args, length):
    mod = sw.from_torch(model, args)
    new, recs = fuse(mod)
    accepted = [r for r in recs if not r.rejected]
    assert [(r.form, r.length) for r in accepted] == [("mlstm", length)], recs
    assert not [r for r in recs if r.rejected], recs
    text = new["main"].script()
    assert text.count("scanweaver.mlstm_scan") == 1
    for op in ("R.maximum", "R.topk", "R.cumsum", "R.slice_scatter"):    # no chunk left
        assert op not in text, op
    with torch.no_grad():
        want = model(*args)
    want = [w.numpy() for w in (want if isinstance(want, tuple) else (want,))]
    assert_outputs_match(run_model(mod, args), want, rtol=1e-5)
    return accepted[0].chunked_mlstm


@pytest.mark.parametrize("b,h,length,key,value,chunk", [
    (1, 2, 12, 8, 16, 4),       # three chunks, K = 2 chunks' rows
    (2, 3, 8, 8, 8, 8),         # one chunk, K = V (v told by the oracle)
    (1, 2, 16, 4, 6, 4),        # K = the chunk
])
def test_hf_chunkwise_kernel_is_one_scan(b, h, length, key, value, chunk):
    args = _inputs(b, h, length, key, value, seed=length + key)
    match = _expect_one_scan(chunkwise(chunk), args, length)
    assert match.spec.normalized and abs(match.spec.eps - 1e-6) < 1e-9
    assert abs(match.scale - key ** -0.5) < 1e-9 * key        # HF scales q by K^-1/2
    assert not match.spec.has_h0 and not match.spec.return_last_state


def test_hf_chunkwise_kernel_with_states_in_and_out():
    args = _inputs(2, 2, 12, 4, 5, seed=5) + _states(2, 2, 4, 5, seed=6)
    match = _expect_one_scan(chunkwise(4, states=True), args, 12)
    assert match.spec.has_h0 and match.spec.return_last_state
    assert sorted(part for _, part in match.final) == ["C", "m", "n"]


def test_a_perturbed_chunk_state_is_a_near_miss(monkeypatch):
    """The states passed between chunks scaled by 1.5 (not an mLSTM any more): the region is
    left as it was, with the reason, and still equal to PyTorch."""
    inner = mx.mlstm_chunkwise_recurrent_fw_C

    def perturbed(*a, **kw):
        c, n, m = inner(*a, **kw)
        return c * 1.5, n, m
    monkeypatch.setattr(mx, "mlstm_chunkwise_recurrent_fw_C", perturbed)
    args = _inputs(1, 2, 12, 4, 8, seed=9)
    model = chunkwise(4)
    mod = sw.from_torch(model, args)
    new, recs = fuse(mod)
    assert "scanweaver.mlstm_scan" not in new["main"].script()
    assert any(r.rejected and "chunkwise mLSTM" in r.reason for r in recs), recs
    with torch.no_grad():
        want = [model(*args).numpy()]
    assert_outputs_match(run_model(mod, args), want, rtol=1e-5)


@pytest.mark.parametrize("length,lengths", [(16, [16]), (20, [16, 4])])
def test_hf_xlstm_model_chunks_fused_and_equal(xlstm, length, lengths):
    """Whole chunks are one scan per layer; the steps after them (HF's sequence kernel, from
    the chunks' final state) another."""
    ids = torch.randint(0, 64, (1, length), generator=torch.Generator().manual_seed(length))
    mod = sw.from_torch(xlstm, (ids,))
    found = sw.find_recurrences(mod, include_rejected=True)
    assert sorted(r.length for r in found if not r.rejected) == sorted(lengths * 2), found
    assert all(r.form == "mlstm" for r in found if not r.rejected)
    assert not [r for r in found if r.rejected], found
    with torch.no_grad():
        want = xlstm(ids, use_cache=False).logits.numpy()
    assert_outputs_match(run_model(mod, [ids]), [want], rtol=1e-4)
