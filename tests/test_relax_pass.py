"""FuseAffineRecurrences + LowerScans on models imported from PyTorch, compiled for LLVM and
compared with PyTorch; near misses are reported and left exactly as they were."""
import pytest
import torch
import tvm
from tvm import relax

import scanweaver_tvm as sw
from scanweaver_tvm import models

from harness import assert_outputs_match, run_model, torch_outputs
from torch_models import Recurrence, inputs


def scans_in(mod):
    return mod.script(show_meta=False).count('"scanweaver.affine_scan"')


FORMS = ["a*h+b", "b+h*a", "decay", "h+x"]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("axis,reverse,init,out", [
    (1, False, "zeros", "stack"), (1, True, "input", "stack"), (0, False, "first", "stack"),
    (2, True, "zeros", "last"), (1, False, "input", "middle"), (0, True, "first", "last")])
def test_affine_forms(form, axis, reverse, init, out):
    model = Recurrence(form, axis, reverse, init, out).eval()
    args = inputs(axis)
    mod = sw.from_torch(model, args)
    found = sw.find_recurrences(mod)
    assert len(found) == 1, sw.find_recurrences(mod, include_rejected=True)
    rec = found[0]
    # h_0 = x_0 is a step from zero only when b_t is x_t itself; otherwise it is the initial state
    length = 6 if (init == "first" and form == "decay") else 7
    assert (rec.length, rec.reverse, rec.form) == (length, reverse, "affine")
    assert rec.state_shape == (2, 6) and rec.dtype == "float32"
    fused = sw.FuseAffineRecurrences()(mod)
    assert scans_in(fused) == 1
    assert "relax.take" not in str(fused) or out == "middle"
    assert_outputs_match(run_model(mod, args), torch_outputs(model, args))


@pytest.mark.parametrize("form,why", [("tanh", "relax.tanh"), ("h*h", "not affine in h")])
def test_near_misses_are_left_alone_and_explained(form, why):
    model = Recurrence(form).eval()
    args = inputs()
    mod = sw.from_torch(model, args)
    assert sw.find_recurrences(mod) == []
    rejected = sw.find_recurrences(mod, include_rejected=True)
    assert rejected and all(r.rejected for r in rejected)
    assert any(why in r.reason for r in rejected), rejected
    fused = sw.FuseAffineRecurrences()(mod)
    tvm.ir.assert_structural_equal(fused, mod)
    assert_outputs_match(run_model(mod, args), torch_outputs(model, args))


class SkippedStep(torch.nn.Module):
    def forward(self, x, g):
        h, outs = torch.zeros_like(x[:, 0]), []
        for t in (0, 1, 2, 4, 5):                                   # index 3 skipped
            h = g[:, t] * h + x[:, t]
            outs.append(h)
        return torch.stack(outs, 1)


class MixedIndex(torch.nn.Module):
    def forward(self, x, g):
        h, outs = torch.zeros_like(x[:, 0]), []
        for t in range(5):
            h = g[:, t + 1] * h + x[:, t]                           # a one step ahead of b
            outs.append(h)
        return torch.stack(outs, 1)


@pytest.mark.parametrize("model,why", [(SkippedStep(), "not consecutive"), (MixedIndex(), "different time indices")])
def test_index_near_misses(model, why):
    args = inputs(length=7)[:2]
    mod = sw.from_torch(model, args)
    assert sw.find_recurrences(mod) == []
    assert any(why in r.reason for r in sw.find_recurrences(mod, include_rejected=True))
    tvm.ir.assert_structural_equal(sw.FuseAffineRecurrences()(mod), mod)
    assert_outputs_match(run_model(mod, args), torch_outputs(model, args))


@pytest.mark.parametrize("length", [1, 7, 64, 256])
@pytest.mark.parametrize("factory", [models.ema, models.linear_rnn, models.mamba_block])
def test_models_match_pytorch(factory, length):
    model, args = factory(length=length)
    mod = sw.from_torch(model, args)
    found = sw.find_recurrences(mod)
    assert len(found) == (1 if length > 1 else 0)
    assert_outputs_match(run_model(mod, args), torch_outputs(model, args))


def test_registered_pipeline_and_pipeline_pass():
    model, args = models.ema(length=5)
    mod = sw.from_torch(model, args)
    ex = tvm.compile(mod, target=tvm.target.Target("llvm"), relax_pipeline="scanweaver")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a.numpy()) for a in args])
    assert_outputs_match([out[0].numpy()], torch_outputs(model, args))
    lowered = sw.passes("llvm")(mod)
    assert "scanweaver_scan" in lowered.script(show_meta=False)      # the scheduled TIR is in the module
    assert "call_pure_packed" not in lowered.script(show_meta=False)


@pytest.mark.parametrize("batch", [1, 2])
def test_mamba_becomes_one_fused_selective_scan(batch):
    """The reference loop, exp(delta*A), delta*B*u and the per-step einsum readouts become one
    selective scan on (u, delta, A, B, C); no (B, D, L, N) tensor is left in the module."""
    model, args = models.mamba_block(length=16, batch=batch)
    mod = sw.from_torch(model, args)
    (rec,) = sw.find_recurrences(mod)
    assert (rec.form, rec.length, rec.state_shape) == ("selective", 16, (batch, 64, 16))
    text = sw.passes("llvm")(mod).script(show_meta=False)
    assert text.count("R.call_tir(cls.scanweaver_scan") == 1
    assert f"R.Tensor(({batch}, 64, 16, 16)" not in text
    assert_outputs_match(run_model(mod, args), torch_outputs(model, args))


class Cumulative(torch.nn.Module):
    def forward(self, x):
        return torch.cumsum(x, 1) + torch.cumprod(x, 2) + torch.cumsum(x, 0, dtype=torch.float64).float()


def test_cumsum_cumprod_only_when_asked():
    x = torch.rand(2, 5, 3) + 0.5
    mod = sw.from_torch(Cumulative(), (x,))
    assert sw.find_recurrences(mod) == []
    tvm.ir.assert_structural_equal(sw.FuseAffineRecurrences()(mod), mod)
    found = sw.find_recurrences(mod, include_rejected=True, cumulative=True)
    assert sorted((r.form, r.axis, r.rejected) for r in found) == [
        ("cumprod", 2, False), ("cumsum", 0, True), ("cumsum", 1, False)]
    assert "dtype" in next(r.reason for r in found if r.rejected)   # the float64 accumulation
    fused = sw.FuseAffineRecurrences(cumulative=True)(mod)
    assert scans_in(fused) == 2
    from relax_pass.lower import LowerScans
    ex = tvm.compile(LowerScans("llvm")(fused), target=tvm.target.Target("llvm"))
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy()))
    assert_outputs_match([out[0].numpy()], torch_outputs(Cumulative(), (x,)))


class StackElsewhere(torch.nn.Module):
    """States stacked on another axis than the one the inputs are sliced along, and in
    reverse time order (``outs`` appended while walking backwards)."""

    def forward(self, x, g):
        h, outs = torch.zeros_like(x[:, 0]), []
        for t in reversed(range(x.shape[1])):
            h = g[:, t] * h + x[:, t]
            outs.append(h)
        return torch.stack(outs, 0), torch.cat(outs, 1)


def test_stack_on_another_axis_and_order():
    args = inputs(length=7)[:2]
    model = StackElsewhere()
    mod = sw.from_torch(model, args)
    (rec,) = sw.find_recurrences(mod)
    assert rec.reverse and rec.axis == 1
    assert scans_in(sw.FuseAffineRecurrences()(mod)) == 1
    assert_outputs_match(run_model(mod, args), torch_outputs(model, args))


def test_mamba_skip_gate_and_softplus_fold_into_the_scan():
    """``(y + u*D) * silu(z)`` after the readouts and ``softplus(delta + bias)`` before them
    become part of the fused scan."""
    model, args = models.mamba_block(length=8)
    mod = sw.from_torch(model, args)
    (rec,) = sw.find_recurrences(mod)
    spec = rec.selective.spec
    assert spec.has_D and spec.has_z and not spec.return_last_state
    assert spec.has_delta_bias and spec.delta_softplus      # softplus(delta + bias) too
    before = mod.script(show_meta=False).count("R.sigmoid(")
    after = sw.FuseAffineRecurrences()(mod).script(show_meta=False).count("R.sigmoid(")
    assert after == before - 1                             # the gate's sigmoid went into the kernel
    assert_outputs_match(run_model(mod, args), torch_outputs(model, args))
