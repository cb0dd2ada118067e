"""PyTorch's ``scan`` higher-order op -> ScanWeaver scan: the eager PyTorch model is the oracle."""
import warnings

import numpy as np
import pytest
import torch
import tvm
from torch._higher_order_ops.scan import scan
from tvm import relax

from scanweaver_tvm import api
from scanweaver_tvm.torch_frontend import UnsupportedScan

warnings.filterwarnings("ignore", category=FutureWarning)


def check(model, args, scans=1):
    """Import with from_torch, compile for the CPU, run in the VM, compare every output."""
    with torch.no_grad():
        want = model(*args)
    want = [want] if isinstance(want, torch.Tensor) else list(want)
    want = [t for w in want for t in (w if isinstance(w, tuple) else (w,))]   # as export flattens
    mod = api.from_torch(model, args)
    assert mod.script().count('"scanweaver.affine_scan"') == scans
    vm = relax.VirtualMachine(api.compile(mod, "llvm"), tvm.cpu())
    flat = [t for a in args for t in (a if isinstance(a, tuple) else (a,))]   # as export flattens
    got = vm["main"](*[tvm.runtime.tensor(a.numpy()) for a in flat])
    got = [got] if isinstance(got, tvm.runtime.Tensor) else list(got)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = g.numpy(), w.numpy()
        assert g.shape == w.shape and g.dtype == w.dtype, f"output {i}: {g.dtype}{g.shape} != {w.dtype}{w.shape}"
        err = float(np.abs(g - w).max()) / max(1.0, float(np.abs(w).max()))
        assert err <= 1e-5, f"output {i}: relative error {err:.3g}"
    return mod


def rand(*shape, low=-1.0, high=1.0):
    return torch.empty(shape).uniform_(low, high)


class Scan(torch.nn.Module):
    """``scan(step, h0, xs, dim, reverse)``; returns (last, ys), ys or last."""

    def __init__(self, step, dim=0, reverse=False, returns="both", **params):
        super().__init__()
        self.step, self.dim, self.reverse, self.returns = step, dim, reverse, returns
        for name, value in params.items():
            self.register_parameter(name, torch.nn.Parameter(value))

    def forward(self, h0, *xs):
        last, ys = scan(lambda h, x: self.step(self, h, x), h0, tuple(xs), dim=self.dim,
                        reverse=self.reverse)
        return {"both": (last, ys), "ys": ys, "last": last}[self.returns]


def a_h_plus_b(_m, h, xs):
    a, b = xs
    h2 = a * h + b
    return h2, h2.clone()


def b_plus_h_a(_m, h, xs):
    a, b = xs
    h2 = b + h * a
    return h2, h2.clone()


def gated(m, h, xs):
    g, x = xs
    h2 = torch.sigmoid(g * m.w) * h + x
    return h2, h2.clone()


def cumsum(_m, h, xs):
    (x,) = xs
    h2 = h + x
    return h2, h2.clone()


@pytest.mark.parametrize("dim,reverse", [(0, False), (0, True), (1, True)])
def test_a_h_plus_b(dim, reverse):
    torch.manual_seed(0)
    shape = (9, 4, 3) if dim == 0 else (4, 9, 3)
    check(Scan(a_h_plus_b, dim, reverse), (torch.randn(4, 3), rand(*shape), torch.randn(*shape)))


@pytest.mark.parametrize("returns", ["ys", "last"])
def test_b_plus_h_times_a(returns):
    torch.manual_seed(1)
    check(Scan(b_plus_h_a, 1, returns=returns),
          (torch.randn(2, 5), rand(2, 17, 5), torch.randn(2, 17, 5)))


@pytest.mark.parametrize("dim,reverse", [(0, False), (1, True)])
def test_sigmoid_gate_with_parameter(dim, reverse):
    torch.manual_seed(2)
    shape = (12, 2, 6) if dim == 0 else (2, 12, 6)
    check(Scan(gated, dim, reverse, w=torch.randn(6)),
          (torch.randn(2, 6), torch.randn(*shape), torch.randn(*shape)))


def test_running_sum():
    torch.manual_seed(3)
    mod = check(Scan(cumsum, 1), (torch.randn(3), torch.randn(3, 20)))
    assert "permute_dims" in mod.script()  # dim 1 was moved to 0 by torch's own scan


def test_single_step_and_scalar_coefficients():
    def step(_m, h, xs):
        (x,) = xs
        h2 = 0.5 * h - x / 4.0 + 1.0
        return h2, h2.clone()

    check(Scan(step), (torch.randn(2, 3), torch.randn(1, 2, 3)))
    check(Scan(step), (torch.randn(2, 3), torch.randn(7, 2, 3)))


def test_invariants_and_broadcast_slices():
    """A per-channel decay (parameter), a constant tensor and a slice of lower rank than the
    carry, broadcast against it like in eager PyTorch."""

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.log_decay = torch.nn.Parameter(-torch.rand(4, 1))
            self.register_buffer("scale", torch.tensor([0.5, 2.0, -1.0]))

        def forward(self, h0, x):
            c = torch.tensor(0.25)

            def step(h, x_t):  # h: (4, 3), x_t: (3,)
                h2 = torch.exp(self.log_decay) * h + (x_t * self.scale - c)
                return h2, h2.clone()

            return scan(step, h0, x, dim=1, reverse=True)

    torch.manual_seed(4)
    check(M(), (torch.randn(4, 3), torch.randn(3, 10)))


def test_outputs_computed_from_the_states():
    """ys beyond the new carry: y = C_t * h (an SSM readout), the previous carry, tanh(h),
    and a carry-free value; the carry stays affine."""

    def step(_m, h, xs):
        a, b, c = xs
        prev = h.clone()
        h2 = a * h + b
        return h2, (c * h2, prev, torch.tanh(h2) * 2.0, c + 1.0)

    class M(Scan):
        def forward(self, h0, *xs):
            last, ys = scan(lambda h, x: step(self, h, x), h0, tuple(xs), dim=1)
            return (last, *ys)

    torch.manual_seed(5)
    check(M(None), (torch.randn(2, 3), rand(2, 11, 3), torch.randn(2, 11, 3),
                    torch.randn(2, 11, 3)))


def test_carry_passes_through():
    def step(_m, h, xs):  # a = 1, b = 0: every state is h0
        return h.clone(), h * 1.0

    check(Scan(step), (torch.randn(3), torch.randn(5, 3)))


def _raises(step, match, n_xs=2):
    args = (torch.randn(2, 3), *[rand(6, 2, 3) for _ in range(n_xs)])
    with pytest.raises(UnsupportedScan, match=match) as err:
        api.from_torch(Scan(step), args)
    assert isinstance(err.value, ValueError)
    assert "scan node 'scan'" in str(err.value)
    return str(err.value)


def test_tanh_of_the_carry_is_rejected():
    def step(_m, h, xs):
        a, b = xs
        h2 = torch.tanh(h) * a + b
        return h2, h2.clone()

    msg = _raises(step, r"node 'tanh' \(tanh.default\) is not affine in state 0")
    assert "combine function" in msg


def test_other_non_affine_combines_are_rejected():
    def square(_m, h, xs):
        a, b = xs
        h2 = h * h * a + b
        return h2, h2.clone()

    def coefficient_from_carry(_m, h, xs):
        a, b = xs
        h2 = torch.sigmoid(a * h) * h + b
        return h2, h2.clone()

    def coupled(_m, h, xs):
        a, b = xs
        h1, h2 = h
        return (h2 * h1 + b, h2 + b), b.clone()

    _raises(square, r"node 'mul' \(mul.Tensor\) is not affine in state 0")
    _raises(coefficient_from_carry, r"\(sigmoid.default\) is not affine in state 0")
    args = ((torch.randn(2, 3), torch.randn(2, 3)), rand(6, 2, 3), rand(6, 2, 3))
    with pytest.raises(UnsupportedScan, match="coupled states"):
        api.from_torch(Scan(coupled), args)


def test_reductions_on_slices_and_several_carries():
    """A coefficient reduced over the feature dim (it commutes with slicing along time) and two
    independent carries, each its own scan, with ys reading both."""
    def reduced(_m, h, xs):
        a, b = xs
        h2 = torch.sigmoid(a.sum(-1, keepdim=True)) * h + b
        return h2, h2.clone()

    def two_carries(_m, h, xs):
        a, b = xs
        h1, h2 = h
        n1, n2 = a * h1 + b, h2 + b
        return (n1, n2), n1 * n2 - h1

    torch.manual_seed(7)
    check(Scan(reduced), (torch.randn(2, 3), rand(6, 2, 3), torch.randn(6, 2, 3)))
    check(Scan(two_carries), ((torch.randn(2, 3), torch.randn(2, 3)), rand(6, 2, 3), torch.randn(6, 2, 3)),
          scans=2)


def test_two_scans_and_a_matrix_update():
    """Two scans in one model (the second runs on the first's states) each become a scan; a
    matrix-valued update (h @ A) is not elementwise and is rejected."""

    class M(torch.nn.Module):
        def forward(self, h0, a, b):
            _, ys = scan(lambda h, x: a_h_plus_b(None, h, x), h0, (a, b))
            return scan(lambda h, x: cumsum(None, h, x), h0, (ys,), reverse=True)

    torch.manual_seed(6)
    check(M(), (torch.randn(2, 3), rand(8, 2, 3), torch.randn(8, 2, 3)), scans=2)

    def matrix(m, h, xs):
        _, b = xs
        h2 = h @ m.A + b
        return h2, h2.clone()

    with pytest.raises(UnsupportedScan, match=r"node 'mm' \(mm.default\) is not affine in state 0"):
        api.from_torch(Scan(matrix, A=torch.randn(3, 3)),
                       (torch.randn(2, 3), rand(6, 2, 3), rand(6, 2, 3)))
