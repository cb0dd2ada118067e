"""sw.compile's cost where nothing is fused: on the CPU the constant calls that TVM's
``FoldConstant`` would build one module each are computed with one build
(``fold_constants.fold_constant_calls``), and the compiled module is exactly the one the pipeline made
without it."""
import numpy as np
import torch
import tvm_ffi
from tvm import relax

import scanweaver_tvm as sw
from scanweaver_tvm import api
from tir_schedules import fold_constants

from harness import assert_outputs_match, run_model


class InPlaceWrites(torch.nn.Module):
    """Per-step writes into zero buffers (``where(arange == t, ...)`` chains after export),
    one of them larger than FoldConstant's 1024 elements (it does not fold that ``full``), and
    a weight transposed (a constant ``transpose``)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(30, 30))

    def forward(self, x):
        big, small = x.new_zeros(2, 6, 30), x.new_zeros(2, 6)
        for t in range(6):
            big[:, t] = x[:, t] @ self.w.t()
            small[:, t] = x[:, t].sum(-1)
        return big * 2, small + 1


def test_folded_at_once_compiles_to_the_same_module():
    x = torch.randn(2, 6, 30, generator=torch.Generator().manual_seed(1))
    mod = sw.from_torch(InPlaceWrites().eval(), (x,))
    target = api._target("llvm")
    fused = api.passes(target)(mod)
    with target:
        plain = api._default_pipeline(target)(fused)
        legalized = relax.transform.LegalizeOps()(fused)
        once = api._legalize_and_fold_at_once(target)(fused)
        folded = api._default_pipeline(target)(once)
    planned = [c for _, c, _ in fold_constants.constant_calls(legalized, legalized["main"]) if c is not None]
    assert planned, "nothing was folded at once"
    assert all(legalized[c].params for c in planned)
    assert tvm_ffi.structural_equal(plain, folded), tvm_ffi.get_first_structural_mismatch(plain, folded)
    with torch.no_grad():
        want = [y.numpy() for y in InPlaceWrites().eval()(x)]
    assert_outputs_match(run_model(mod, [x]), want, rtol=1e-5)


def test_a_large_creation_is_left_as_foldconstant_leaves_it():
    """(2, 6, 30) zeros: 360 elements, folded; the same at (2, 60, 30): 3600, not folded."""
    x = torch.randn(2, 60, 30)

    class Zeros(torch.nn.Module):
        def forward(self, x):
            return x + x.new_zeros(2, 60, 30), x[:, :1] + x.new_zeros(2, 1, 30)

    mod = sw.from_torch(Zeros().eval(), (x,))
    target = api._target("llvm")
    with target:
        legalized = relax.transform.LegalizeOps()(mod)
    shapes = [tuple(int(v) for v in b.var.ty.shape.values)
              for b, c, _ in fold_constants.constant_calls(legalized, legalized["main"]) if c is not None]
    assert shapes == [(2, 1, 30)], shapes
