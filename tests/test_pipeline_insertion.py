"""Putting our pass into a user's pipeline: ``tvm.compile(mod, target,
relax_pipeline=sw.pipeline(target))`` (or ``relax_pipeline="scanweaver"``) lowers exactly as
``sw.compile`` does, our CPU rules included; ``sw.passes`` (our two passes alone) in front of
TVM's default pipeline computes the same, with the dense layer left to TVM."""
import numpy as np
import pytest
import torch
import tvm
import tvm_ffi
from tvm import relax

import scanweaver_tvm as sw
from harness import assert_outputs_match, torch_outputs
from scanweaver_tvm import api
from tir_schedules.cpu_rule import RULE_ATTR


class ScanAfterDense(torch.nn.Module):
    """A dense layer feeding a gated recurrence h_t = g_t * h_{t-1} + (x W + b)_t."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(32, 48)

    def forward(self, x, g):
        u = self.lin(x)
        h, outs = torch.zeros_like(u[:, 0]), []
        for t in range(u.shape[1]):
            h = g[:, t] * h + u[:, t]
            outs.append(h)
        return torch.stack(outs, 1)


@pytest.fixture(scope="module")
def case():
    torch.manual_seed(0)
    model = ScanAfterDense().eval()
    args = (torch.randn(2, 8, 32), torch.rand(2, 8, 48))
    return model, args, sw.from_torch(model, args), api._target("llvm")


def _run(executable, args):
    out = relax.VirtualMachine(executable, tvm.cpu())["main"](*[tvm.runtime.tensor(a.numpy()) for a in args])
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


def _rules(mod):
    return {str(f.attrs[RULE_ATTR]) for _, f in mod.functions_items()
            if isinstance(f, tvm.tirx.PrimFunc) and f.attrs and RULE_ATTR in f.attrs}


def _assert_same_module(got, want):
    assert tvm_ffi.structural_equal(got, want), tvm_ffi.get_first_structural_mismatch(got, want)


@pytest.mark.parametrize("weights", [None, "int8"])
def test_documented_insertion_lowers_as_compile_does(case, monkeypatch, weights):
    """What ``sw.compile`` hands ``tvm.compile`` (module and Relax pipeline), lowered, is the
    module ``sw.pipeline`` and the registered ``"scanweaver"`` pipeline lower: the scan and the
    dense layer scheduled by our rule; the executables' VM code is the same and their outputs
    torch's (int8: within the weights' rounding)."""
    model, args, mod, target = case
    handed, build = [], tvm.compile

    def recording(mod, target=None, relax_pipeline="default", **kwargs):
        handed.append((mod, relax_pipeline))
        return build(mod, target=target, relax_pipeline=relax_pipeline, **kwargs)

    monkeypatch.setattr(tvm, "compile", recording)
    ours = sw.compile(mod, "llvm", weights=weights)
    monkeypatch.undo()
    ((given, compile_pipeline),) = handed
    with target:
        by_compile = compile_pipeline(given)
        registered = relax.get_pipeline("scanweaver", weights=weights)(mod)
    documented = sw.pipeline(target, weights=weights)(mod)
    _assert_same_module(by_compile, documented)
    _assert_same_module(registered, documented)
    assert {"DenseCPU", "ElementwiseCPU"} <= _rules(documented)
    assert any(gv.name_hint.startswith("scanweaver_scan") for gv in documented.get_global_vars())

    theirs = tvm.compile(mod, target=target, relax_pipeline=sw.pipeline(target, weights=weights))
    assert theirs.as_text() == ours.as_text()
    got = _run(theirs, args)
    np.testing.assert_array_equal(got[0], _run(ours, args)[0])
    assert_outputs_match(got, torch_outputs(model, args), rtol=1e-4 if weights is None else 2e-2)


def test_our_passes_before_tvms_pipeline_are_correct_but_lose_our_rules(case):
    """``sw.passes`` then ``relax.get_default_pipeline``: the scan is ours and the outputs
    torch's, but no function carries our rules (the dense layer is TVM's loop nest): the reason
    ``sw.pipeline`` replaces TVM's pipeline rather than going in front of it."""
    model, args, mod, target = case
    seq = tvm.transform.Sequential([sw.passes(target), relax.get_default_pipeline(target)])
    with target:
        lowered = seq(mod)
    assert any(gv.name_hint.startswith("scanweaver_scan") for gv in lowered.get_global_vars())
    assert not _rules(lowered)
    assert_outputs_match(_run(tvm.compile(mod, target=target, relax_pipeline=seq), args), torch_outputs(model, args))
