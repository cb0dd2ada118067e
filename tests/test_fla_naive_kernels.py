"""fla-core's own reference kernels (``fla.ops.*.naive``, pinned in the dev extra) as a user
hands them to us: each recurrent, chunked or parallel form is found as the scan it computes,
leaves no (L, L) or block tensor behind, and equals what fla computes.  The forms fla ships
with a matrix coefficient (the delta rule) are delta-rule scans.  Small sizes
keep the file fast; fla imports once per worker (~10 s: it probes triton)."""
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import scanweaver_tvm as sw

from harness import run_model
from test_matrix_forms import _run
from test_hf_models import tensor_shapes

with warnings.catch_warnings():
    warnings.simplefilter("ignore")       # "Triton is not supported on current platform"
    fla_ops = pytest.importorskip("fla.ops")
    from fla.ops.delta_rule.naive import delta_rule_recurrence
    from fla.ops.gla.naive import naive_recurrent_gla
    from fla.ops.gsa.naive import naive_recurrent_gsa
    from fla.ops.hgrn.naive import naive_recurrent_hgrn
    from fla.ops.linear_attn.naive import naive_chunk_linear_attn, naive_recurrent_linear_attn
    from fla.ops.retention.naive import naive_retention
    from fla.ops.rwkv6.recurrent_naive import naive_recurrent_rwkv6
    from fla.ops.simple_gla.naive import (naive_chunk_simple_gla, naive_parallel_simple_gla,
                                          naive_recurrent_simple_gla)

B, H, K, V = 2, 3, 4, 5


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        out = self.fn(*args)
        return tuple(o for o in out if o is not None) if isinstance(out, tuple) else out


def _rand(seed):
    gen = torch.Generator().manual_seed(seed)
    return lambda *shape: torch.randn(*shape, generator=gen)


def _log_gate(rand, *shape):
    return F.logsigmoid(rand(*shape))


def _check(fn, args, forms, rtol=1e-4):
    """Found as ``forms`` ([(form, length)], none rejected), equal to fla's own result; the
    lowered module returned for shape checks."""
    model = Fn(fn)
    mod = sw.from_torch(model, args)
    found = sw.find_recurrences(mod, include_rejected=True)
    assert [(r.form, r.rejected, r.length) for r in found] == [(f, False, n) for f, n in forms], found
    with torch.no_grad():
        want = model(*args)
    want = [w.double().numpy() for w in (want if isinstance(want, tuple) else (want,))]
    got = _run(mod, args)                 # (bf16 inputs through numpy)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert np.abs(g - w).max() <= rtol * max(1.0, np.abs(w).max())
    return found


def _square(shapes, length):
    """Shapes holding an (L, L) or (C, C) pair of trailing dims: a parallel form's scores."""
    return [s for s in shapes if len(s) >= 2 and s[-1] == s[-2] == length]


# ---------------------------------------------------------------- recurrent forms

@pytest.mark.parametrize("length", [1, 2, 7])
def test_recurrent_gla_with_initial_and_final_state(length):
    r = _rand(0)
    args = (r(B, length, H, K), r(B, length, H, K), r(B, length, H, V), _log_gate(r, B, length, H, K),
            r(B, H, K, V))
    fn = lambda q, k, v, gk, h0: naive_recurrent_gla(q, k, v, gk, h0, output_final_state=True)  # noqa: E731
    found = _check(fn, args, [("matrix", length)] if length > 1 else [])
    if length > 1:
        assert found[0].state_shape == (B, H, K, V)


def test_recurrent_gla_in_bf16_keeps_a_float32_state():
    r = _rand(1)
    args = tuple(x.bfloat16() for x in (r(1, 9, H, K), r(1, 9, H, K), r(1, 9, H, V),
                                        _log_gate(r, 1, 9, H, K)))
    _check(naive_recurrent_gla, args, [("matrix", 9)], rtol=2e-2)


def test_recurrent_simple_gla_from_an_initial_state():
    r = _rand(2)
    args = (r(B, 6, H, K), r(B, 6, H, K), r(B, 6, H, V), _log_gate(r, B, 6, H), r(B, H, K, V))
    fn = lambda q, k, v, g, h0: naive_recurrent_simple_gla(q, k, v, g, initial_state=h0)  # noqa: E731
    _check(fn, args, [("matrix", 6)])


@pytest.mark.parametrize("normalize", [False, True])
def test_recurrent_linear_attention(normalize):
    r = _rand(3)
    q, k, v = r(B, 5, H, K), r(B, 5, H, K), r(B, 5, H, V)
    if normalize:                  # positive features, as the normalizer expects
        fn = lambda q, k, v: naive_recurrent_linear_attn(q.sigmoid(), k.sigmoid(), v, normalize=True)  # noqa: E731
    else:
        fn = lambda q, k, v: naive_recurrent_linear_attn(q, k, v, output_final_state=True)  # noqa: E731
    _check(fn, (q, k, v), [("matrix", 5)])


def test_gated_slot_attention_is_two_matrix_scans():
    """GSA: a GLA pass over the slots, a softmax, a second pass (the gates from
    ``logcumsumexp`` when none is given)."""
    r = _rand(4)
    args = (r(1, 6, H, K), r(1, 6, H, K), r(1, 6, H, V), r(1, 6, H, 3))
    _check(lambda q, k, v, s: naive_recurrent_gsa(q, k, v, s), args, [("matrix", 6), ("matrix", 6)])


def test_hgrn_is_an_affine_scan():
    r = _rand(5)
    args = (r(B, 8, 6), _log_gate(r, B, 8, 6), r(B, 6))
    fn = lambda x, g, h0: naive_recurrent_hgrn(x, g, h0, output_final_state=True)  # noqa: E731
    _check(fn, args, [("affine", 8)])


def test_rwkv6_reads_the_state_before_its_update():
    """RWKV-6's ``o_t = q_t (S_(t-1) + u k_t v_t^T)``: an affine scan, correct; the matrix
    kernel's readout is after the update, which the recurrence's ``matrix_miss`` says."""
    r = _rand(6)
    args = (r(1, H, 7, K), r(1, H, 7, K), r(1, H, 7, V), _log_gate(r, 1, H, 7, K), r(H, K))
    found = _check(naive_recurrent_rwkv6, args, [("affine", 6)])   # (the last update is never read)
    assert "before each step's update" in found[0].matrix_miss


def test_delta_rule_is_one_delta_scan():
    """``S += k (beta (v - k^T S))^T``: the coefficient of S is a matrix; one delta-rule scan
    (``relax_pass/forms/delta/delta.py``; more forms in ``tests/test_delta_detect.py``), equal to fla."""
    r = _rand(7)
    args = (r(1, H, 6, K), F.normalize(r(1, H, 6, K), dim=-1), r(1, H, 6, V), r(1, H, 6).sigmoid())
    _check(delta_rule_recurrence, args, [("delta", 6)])


# ---------------------------------------------------------------- chunked and parallel forms

@pytest.mark.parametrize("length,final", [(7, True), (8, False), (13, True)])
def test_chunk_simple_gla_with_padding_and_final_state(length, final):
    """Padded to chunks of 4, a loop over chunks; with ``output_final_state`` the update after
    the last chunk (which the output never reads) is the scan's final state."""
    r = _rand(8)
    args = (r(B, length, H, K), r(B, length, H, K), r(B, length, H, V), _log_gate(r, B, length, H))
    fn = lambda q, k, v, g: naive_chunk_simple_gla(q, k, v, g, output_final_state=final, chunk_size=4)  # noqa: E731
    found = _check(fn, args, [("matrix", length)])
    assert found[0].chunked.spec.return_last_state == final
    assert not _square(tensor_shapes(sw.passes("llvm")(sw.from_torch(Fn(fn), args))), 4)


@pytest.mark.parametrize("length", [7, 11])
def test_parallel_simple_gla_with_its_score_scale(length):
    """``(q k^T * scale) * exp(tril(G_i - G_j))`` then ``@ v``: the scale on the scores is
    read off as the output's, the (L, L) scores are gone."""
    r = _rand(9)
    args = (r(B, length, H, K), r(B, length, H, K), r(B, length, H, V), _log_gate(r, B, length, H))
    fn = lambda q, k, v, g: naive_parallel_simple_gla(q, k, v, g)[0]  # noqa: E731
    found = _check(fn, args, [("matrix", length)])
    np.testing.assert_allclose(found[0].chunked.scale, [K ** -0.5] * H, rtol=1e-6)
    assert not _square(tensor_shapes(sw.passes("llvm")(sw.from_torch(Fn(fn), args))), length)


def test_parallel_simple_gla_returning_its_scores_is_left_alone():
    """The (L, L) scores are returned too: the region cannot go, and nothing changes."""
    r = _rand(10)
    args = (r(1, 7, H, K), r(1, 7, H, K), r(1, 7, H, V), _log_gate(r, 1, 7, H))
    model = Fn(naive_parallel_simple_gla)
    mod = sw.from_torch(model, args)
    found = sw.find_recurrences(mod, include_rejected=True)
    assert [(r.form, r.rejected) for r in found] == [("matrix", True)]
    assert "returned" in found[0].reason
    with torch.no_grad():
        want = [w.numpy() for w in model(*args)]
    for g, w in zip(run_model(mod, list(args)), want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("length", [2, 3, 33])
def test_retention_is_a_matrix_scan_with_its_gammas(length):
    """``naive_retention``: gammas ``1 - 2^(-5 - h)`` through ``exp2`` and a ``ge`` mask, a
    3-operand einsum: the decay per head is read off."""
    r = _rand(11)
    heads = 4
    args = (r(B, heads, length, 8), r(B, heads, length, 8), r(B, heads, length, 6))
    found = _check(naive_retention, args, [("matrix", length)])
    gammas = 1 - 2.0 ** (-5.0 - np.arange(heads))
    np.testing.assert_allclose(found[0].chunked.decay_values, np.tile(gammas, B), rtol=1e-6)   # (B*H lanes)


def test_chunk_linear_attention_cumsum_over_chunks():
    """Chunks of 64 (fla's fixed size): the chunk states summed by ``cumsum`` and shifted by a
    concat, a masked intra-chunk part."""
    r = _rand(12)
    args = (r(1, 128, 2, K), r(1, 128, 2, K), r(1, 128, 2, V))
    _check(naive_chunk_linear_attn, args, [("matrix", 128)])
