"""relax_pass/forms/stabilized/stabilized.py: RWKV-4's WKV loop, as HF runs it on a CPU and torch.export unrolls
it, read as one stabilized scan by what it computes; compiled and equal to PyTorch."""
import numpy as np
import pytest
import torch
from torch import nn

import scanweaver_tvm as sw
from relax_pass.forms.stabilized.stabilized import StabilizedMatch, find_stabilized
from relax_pass.forms.stabilized.standalone import fuse_stabilized
from tests.harness import assert_outputs_match, run_model, torch_outputs


def _users(func):
    from relax_pass.forms.stabilized.stabilized import _users as users
    return users(func)


def _matches(mod):
    func = mod["main"]
    value = {b.var: b.value for blk in func.body.blocks for b in blk.bindings}
    return [m for _, m in find_stabilized(func, value, _users(func))]


class WKV(nn.Module):
    """transformers' ``rwkv_linear_attention_cpu`` on (B, L, C) key/value, parameters per channel."""

    def __init__(self, channels, return_state, with_state=False, batch=2):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.time_decay = nn.Parameter(torch.randn(channels, generator=g))
        self.time_first = nn.Parameter(torch.randn(channels, generator=g))
        self.return_state = return_state
        self.state = [torch.randn(batch, channels, generator=g), torch.rand(batch, channels, generator=g) + .5,
                      torch.randn(batch, channels, generator=g) * 3] if with_state else None

    def forward(self, key, value):
        from transformers.models.rwkv.modeling_rwkv import rwkv_linear_attention_cpu
        out, state = rwkv_linear_attention_cpu(self.time_decay, self.time_first, key, value,
                                               state=self.state, return_state=self.return_state)
        return (out, *state) if self.return_state else out


@pytest.fixture(scope="module")
def rwkv():
    """HF RwkvForCausalLM, tiny (hidden 32, 2 layers: HF's weight init divides by layers - 1),
    L = 16, traced as sw.from_torch does (use_cache=False)."""
    from transformers import RwkvConfig, RwkvForCausalLM

    torch.manual_seed(0)
    cfg = RwkvConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, attention_hidden_size=32,
                     intermediate_size=64, context_length=64)
    model = RwkvForCausalLM(cfg).eval()
    ids = torch.randint(0, 50, (1, 16))
    return model, ids, sw.from_torch(model, (ids,))


def test_hf_rwkv_matches_both_layers(rwkv):
    _, _, mod = rwkv
    found = _matches(mod)
    assert len(found) == 2 and all(isinstance(m, StabilizedMatch) for m in found), found
    for m in found:
        assert m.length == 16 and m.has_bonus and m.has_values and not m.reverse and not m.last_used
        assert m.channel_w and m.channel_u


def test_hf_rwkv_fused_compiles_and_equals_pytorch(rwkv):
    model, ids, mod = rwkv
    new, report = fuse_stabilized(mod)
    assert [isinstance(r[2], StabilizedMatch) for r in report] == [True, True], report
    text = new.script()
    assert text.count("scanweaver.stabilized_scan") == 2 and "R.maximum" not in text
    assert len(text.splitlines()) < len(mod.script().splitlines()) / 4
    assert mod.script().count("scanweaver.stabilized_scan") == 0     # the input is left as it was
    got = run_model(new, (ids,))
    with torch.no_grad():
        want = model(ids).logits.numpy()
    assert_outputs_match(got, [want], rtol=1e-4)


@pytest.mark.parametrize("with_state", [False, True])
def test_wkv_with_its_final_state(with_state):
    """``return_state=True``: every update is live, the final (num, den, max) are outputs too;
    an initial state given as a constant."""
    model = WKV(8, return_state=True, with_state=with_state).eval()
    g = torch.Generator().manual_seed(1)
    args = (torch.rand(2, 12, 8, generator=g) * 60 - 30, torch.randn(2, 12, 8, generator=g))
    mod = sw.from_torch(model, args)
    found = _matches(mod)
    assert len(found) == 1 and isinstance(found[0], StabilizedMatch) and found[0].last_used, found
    new, _ = fuse_stabilized(mod)
    assert new.script().count("scanweaver.stabilized_scan") == 1
    assert_outputs_match(run_model(new, args), torch_outputs(model, args), rtol=1e-4)


class Written(nn.Module):
    """The WKV loop written out and stacked (``torch.stack(outs, dim=1)``); with ``twice``, a
    WKV whose den adds 2 exp(k - m) (``twice="den"``: not its form), or whose max moves by
    2w while num and den decay by w (``twice="max"``: its form, but not its numbers)."""

    def __init__(self, twice=None):
        super().__init__()
        self.twice = twice

    def forward(self, key, value):
        w = -torch.ones(key.shape[-1])
        num = torch.zeros_like(key[:, 0])
        den = torch.zeros_like(key[:, 0])
        m = torch.zeros_like(key[:, 0]) - 1e38
        outs = []
        for t in range(key.shape[1]):
            k = key[:, t]
            p = torch.maximum(m, k)
            e1, e2 = torch.exp(m - p), torch.exp(k - p)
            outs.append((e1 * num + e2 * value[:, t]) / (e1 * den + e2))
            m2 = torch.maximum(m + (2 * w if self.twice == "max" else w), k)
            e1, e2 = torch.exp(m + w - m2), torch.exp(k - m2)
            num, den, m = e1 * num + e2 * value[:, t], e1 * den + (2 * e2 if self.twice == "den" else e2), m2
        return torch.stack(outs, dim=1)


@pytest.mark.parametrize("twice, why", [("den", "no den state"), ("max", "is not the stabilized step's")])
def test_a_near_miss_says_why(twice, why):
    args = (torch.randn(1, 6, 4), torch.randn(1, 6, 4))
    found = _matches(sw.from_torch(Written(twice), args))
    assert found and all(isinstance(m, str) and why in m for m in found), found


def test_a_stacked_loop_written_out():
    g = torch.Generator().manual_seed(2)
    args = (torch.randn(2, 9, 5, generator=g) * 20, torch.randn(2, 9, 5, generator=g))
    model = Written()
    mod = sw.from_torch(model, args)
    found = _matches(mod)
    assert len(found) == 1 and isinstance(found[0], StabilizedMatch) and found[0].has_bonus, found
    new, _ = fuse_stabilized(mod)
    assert new.script().count("scanweaver.stabilized_scan") == 1 and "R.maximum" not in new.script()
    assert_outputs_match(run_model(new, args), torch_outputs(model, args), rtol=1e-4)


def test_as_recurrences_for_the_pass(rwkv):
    """``find_stabilized_scans``: what FuseAffineRecurrences's hook reads (chains.Recurrence)."""
    from relax_pass.forms.stabilized.stabilized import find_stabilized_scans
    _, _, mod = rwkv
    recs = find_stabilized_scans(mod)
    assert [(r.form, r.rejected, r.length) for r in recs] == [("stabilized", False, 16)] * 2
    assert all(isinstance(r.stabilized, StabilizedMatch) and r.stabilized.emit_at is not None for r in recs)
    assert "stabilized recurrence in main" in repr(recs[0])


def test_a_long_loop():
    """A written loop of L = 96 steps (~2,400 bindings) is one scan too.  (HF RWKV at L = 128
    recursed past Python's limit before the slice templates were made in binding order; that
    import takes ~50 s, so it is measured, not tested, here.)"""
    g = torch.Generator().manual_seed(4)
    args = (torch.randn(1, 96, 4, generator=g) * 10, torch.randn(1, 96, 4, generator=g))
    model = Written()
    new, report = fuse_stabilized(sw.from_torch(model, args))
    assert [isinstance(r[2], StabilizedMatch) for r in report] == [True], report
    assert_outputs_match(run_model(new, args), torch_outputs(model, args), rtol=1e-4)


def test_hf_rwkv_fused_builds_for_cuda(rwkv):
    """The fused model compiles for sm_90 (stabilized_gpu for the scans; no GPU run here)."""
    from tir_schedules import cuda_check
    _, _, mod = rwkv
    new, _ = fuse_stabilized(mod)
    ex = sw.compile(new, {"kind": "cuda", "arch": "sm_90"})
    assert any("__syncthreads" in s and "expf" in s for s in cuda_check.module_cuda_sources(ex.mod))


def test_hf_rwkv_through_the_public_pass_is_one_stabilized_scan_per_layer():
    """``sw.find_recurrences`` / ``sw.compile`` (FuseAffineRecurrences itself, not the
    stand-alone pass): each WKV loop one scan, the max chain's near miss gone, equal to PyTorch."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.RwkvConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                  attention_hidden_size=32, intermediate_size=64, context_length=64)
    model = transformers.RwkvForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(1))
    mod = sw.from_torch(model, (ids,))
    found = sw.find_recurrences(mod, include_rejected=True)
    assert [(r.form, r.rejected, r.length) for r in found] == [("stabilized", False, 16)] * 2, found
    with torch.no_grad():
        want = model(ids, use_cache=False).logits.numpy()
    assert_outputs_match(run_model(mod, [ids]), [want], rtol=1e-4)


class LogCumSumExpLoop(nn.Module):
    """A logcumsumexp written as a loop: a running max (no decay) and the one sum it
    rescales (den only), read out as ``m + log(s)``."""

    def forward(self, x):
        m = torch.full_like(x[:, 0], -1e38)
        s = torch.zeros_like(x[:, 0])
        outs = []
        for t in range(x.shape[1]):
            m_new = torch.maximum(m, x[:, t])
            s = s * torch.exp(m - m_new) + torch.exp(x[:, t] - m_new)
            m = m_new
            outs.append(m + torch.log(s))
        return torch.stack(outs, 1)


def test_a_running_max_loop_is_a_near_miss_with_its_reason():
    """Not fused yet (a den-only loop with no decay), but reported as what it is, and
    compiled as it was: equal to ``torch.logcumsumexp``."""
    x = torch.randn(2, 9, 5, generator=torch.Generator().manual_seed(0))
    mod = sw.from_torch(LogCumSumExpLoop(), (x,))
    found = sw.find_recurrences(mod, include_rejected=True)
    assert [(r.rejected, "running max m = max(m, k_t)" in r.reason) for r in found] == [(True, True)], found
    np.testing.assert_allclose(run_model(mod, [x])[0], torch.logcumsumexp(x, 1).numpy(), rtol=1e-5, atol=1e-5)


def test_a_max_of_three_tensors_is_no_loop():
    """``max(max(a, b), c)``: no running max, nothing reported."""
    fn = lambda a, b, c: torch.maximum(torch.maximum(a, b), c) * 2.0  # noqa: E731
    args = tuple(torch.randn(2, 4) for _ in range(3))

    class Fn(nn.Module):
        def forward(self, *xs):
            return fn(*xs)

    assert sw.find_recurrences(sw.from_torch(Fn(), args), include_rejected=True) == []
