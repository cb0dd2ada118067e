"""Recurrences written the way people write them (issue "Right on code it has never seen"):
negative and keyword dims, clamp/lerp/convex combinations, sums of terms, casts and transposes
of the state inside the step.  Each goes through the public API (``sw.from_torch``,
``find_recurrences``, ``sw.compile``), is compared with PyTorch, and the fused module must keep
the imported signature."""
import numpy as np
import pytest
import torch
import tvm
import tvm_ffi
from tvm import relax

import scanweaver_tvm as sw

from harness import assert_outputs_match, run_model, torch_outputs

B, D, L = 2, 8, 12


def _loop(step, stack=lambda hs: torch.stack(hs, -1), time_dim=-1):
    class Model(torch.nn.Module):
        def forward(self, a, b):
            h = torch.zeros_like(b.select(time_dim, 0))
            hs = []
            for t in range(b.shape[time_dim]):
                h = step(h, a.select(time_dim, t), b.select(time_dim, t))
                hs.append(h)
            return stack(hs)
    return Model().eval()


def _args(shape=(B, D, L), seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g), torch.randn(shape, generator=g)


FORMS = {
    "stack(hs, -1)": (lambda h, a, b: a * h + b, lambda hs: torch.stack(hs, -1)),
    "stack(hs, dim=-2)": (lambda h, a, b: a * h + b, lambda hs: torch.stack(hs, dim=-2)),
    "stack(hs, 0)": (lambda h, a, b: a * h + b, lambda hs: torch.stack(hs, 0)),
    "cat(hs, -1)": (lambda h, a, b: a * h + b, lambda hs: torch.cat(hs, -1)),
    "clamp": (lambda h, a, b: torch.clamp(a, 0.0, 0.99) * h + b, None),
    "sum of three terms": (lambda h, a, b: a * h + b + 0.5, None),
    "sum, state last": (lambda h, a, b: b + 0.25 + a * h, None),
    "lerp": (lambda h, a, b: torch.lerp(h, b, a), None),
    "h + z*(x - h)": (lambda h, a, b: h + a * (b - h), None),
    "(1 - z)*h + z*x": (lambda h, a, b: (1 - a) * h + a * b, None),
    "h - a*h + b": (lambda h, a, b: h - a * h + b, None),
    "divide": (lambda h, a, b: h / (1.0 + a) + b, None),
    "transposed state": (lambda h, a, b: (a.transpose(0, 1) * h.transpose(0, 1) + b.transpose(0, 1)).transpose(0, 1), None),
    "expand_dims coefficient": (lambda h, a, b: (h.unsqueeze(-1) * a.unsqueeze(-1) + b[..., None]).squeeze(-1), None),
    "negated": (lambda h, a, b: -(-a * h - b), None),
    "cast inside": (lambda h, a, b: (a.double() * h.double() + b.double()).float(), None),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_forms_are_fused_and_match_pytorch(form):
    step, stack = FORMS[form]
    model = _loop(step, stack or (lambda hs: torch.stack(hs, -1)))
    args = _args()
    mod = sw.from_torch(model, args)
    found = sw.find_recurrences(mod)
    assert len(found) == 1, sw.find_recurrences(mod, include_rejected=True)
    assert found[0].length == L and found[0].validation_s is not None
    fused = sw.FuseAffineRecurrences()(mod)
    assert fused.script().count('"scanweaver.affine_scan"') == 1
    tvm_ffi.structural_equal(fused["main"].ret_ty, mod["main"].ret_ty) or pytest.fail(
        f"signature changed: {fused['main'].ret_ty} vs {mod['main'].ret_ty}")
    assert_outputs_match(run_model(mod, args), torch_outputs(model, args))


def test_stack_on_the_last_axis_keeps_the_shape_and_feeds_a_second_recurrence():
    """Issue case 1: ``torch.stack(hs, -1)`` came back (B, L, D); a second recurrence over the
    result then failed to compile."""
    class Two(torch.nn.Module):
        def forward(self, a, b):
            h, hs = torch.zeros_like(b[..., 0]), []
            for t in range(b.shape[-1]):
                h = a[..., t] * h + b[..., t]
                hs.append(h)
            s = torch.stack(hs, -1)
            g, gs = torch.zeros_like(s[..., 0]), []
            for t in range(s.shape[-1]):
                g = 0.5 * g + s[..., t]
                gs.append(g)
            return torch.stack(gs, dim=-1)

    model, args = Two().eval(), _args()
    mod = sw.from_torch(model, args)
    assert len(sw.find_recurrences(mod)) == 2
    fused = sw.FuseAffineRecurrences()(mod)
    assert tvm_ffi.structural_equal(fused["main"].ret_ty, mod["main"].ret_ty)
    assert_outputs_match(run_model(mod, args), torch_outputs(model, args))


def test_clamp_is_one_chain_not_a_report_per_step():
    """Issue case 2: clip's bounds are fresh wrappers per step; keyed by structure they match."""
    model, args = _loop(FORMS["clamp"][0]), _args()
    every = sw.find_recurrences(sw.from_torch(model, args), include_rejected=True)
    assert len(every) == 1 and not every[0].rejected, every


def test_validation_refuses_a_wrong_rewrite(monkeypatch):
    """The translation validation is the last line: a rewrite that stacks the states on the
    wrong axis (the bug of issue case 1, put back on purpose) is found and left alone."""
    from relax_pass.forms.affine import plan

    def transposed(bb, states, axis, rank, cat_axis, expand, increasing, shape):
        perm = list(range(rank + 1))
        perm[-1], perm[-2] = perm[-2], perm[-1]
        wrong = bb.emit(relax.op.permute_dims(states, perm))
        return bb.emit(relax.op.reshape(wrong, shape))   # same shape, wrong layout

    monkeypatch.setattr(plan, "gathered", transposed)
    model, args = _loop(FORMS["stack(hs, -1)"][0]), _args((B, L, L))
    mod = sw.from_torch(model, args)
    every = sw.find_recurrences(mod, include_rejected=True)
    assert len(every) == 1 and every[0].rejected and "validation failed" in every[0].reason, every
    assert "differs on probe inputs" in every[0].reason
    tvm.ir.assert_structural_equal(sw.FuseAffineRecurrences()(mod), mod)


def test_validation_refuses_a_type_change(monkeypatch):
    """(a) of the validation: a replacement of another shape is refused before any probe."""
    from relax_pass.forms.affine import plan

    def wrong_shape(bb, states, axis, rank, cat_axis, expand, increasing, shape):
        return states                  # (B, D, L) where the stack is (L, B, D)

    monkeypatch.setattr(plan, "gathered", wrong_shape)
    model, args = _loop(*FORMS["stack(hs, 0)"]), _args()
    mod = sw.from_torch(model, args)
    every = sw.find_recurrences(mod, include_rejected=True)
    assert every[0].rejected and "would become" in every[0].reason, every


def test_state_squared_is_still_a_near_miss():
    model, args = _loop(lambda h, a, b: 0.1 * a * h * h + 0.1 * b), _args()
    mod = sw.from_torch(model, args)
    assert sw.find_recurrences(mod) == []
    tvm.ir.assert_structural_equal(sw.FuseAffineRecurrences()(mod), mod)
    assert_outputs_match(run_model(mod, args), torch_outputs(model, args))


def test_matmul_readout_next_to_a_selective_looking_chain_does_not_crash():
    """Issue case 8: the selective matcher's numpy probe raised on a readout it did not expect."""
    class Readout(torch.nn.Module):
        def forward(self, dA, dBu, C):
            h, ys = torch.zeros_like(dA[:, :, 0]), []
            for t in range(dA.shape[2]):
                h = dA[:, :, t] * h + dBu[:, :, t]
                ys.append(torch.matmul(h, C[:, t, :].unsqueeze(-1))[:, :, 0])
            return torch.stack(ys, dim=-1)

    g = torch.Generator().manual_seed(1)
    args = (torch.rand(2, 4, 6, 3, generator=g), torch.randn(2, 4, 6, 3, generator=g),
            torch.randn(2, 6, 3, generator=g))
    model = Readout().eval()
    mod = sw.from_torch(model, args)
    found = sw.find_recurrences(mod, include_rejected=True)
    assert found, "the chain is found (as a plain affine scan at least)"
    assert_outputs_match(run_model(mod, args), torch_outputs(model, args))


def test_registered_pipeline_right_after_import():
    """Issue case 12: ``relax_pipeline="scanweaver"`` works after a bare ``import scanweaver_tvm``."""
    import subprocess
    import sys

    code = ("import scanweaver_tvm, tvm\nfrom tvm import relax\n"
            "print(relax.get_pipeline('scanweaver') is not None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True", out.stderr


def test_probe_interpreter_agrees_with_tvm():
    """The validation's interpreter gives the ops their TVM meaning (checked against TVM)."""
    from relax_pass.interpret import Interpreter

    x = relax.Var("x", relax.TensorType((2, 3, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.permute_dims(x, [2, 0, 1]))
            y = bb.emit(relax.op.clip(y, 0.1, 0.7))
            y = bb.emit(relax.op.strided_slice(y, [1], [1], [2]))
            y = bb.emit(relax.op.where(relax.op.greater(y, relax.const(0.3)), y, relax.op.exp(y)))
            y = bb.emit(relax.op.sum(relax.op.expand_dims(y, [0]), axis=[-1], keepdims=True))
            z = bb.emit(relax.op.nn.layer_norm(x, relax.const(np.linspace(0.5, 2, 4), "float32"),
                                               relax.const(np.linspace(-1, 1, 4), "float32"), [-1], 1e-5))
            z = bb.emit(relax.op.nn.rms_norm(relax.op.nn.gelu(z), relax.const(np.linspace(1, 3, 4), "float32"),
                                             [-1], 1e-5))
            z = bb.emit(relax.op.add(relax.op.nn.log_softmax(relax.op.nn.gelu_tanh(z), 1), relax.op.nn.softmax(z, 0)))
            out = bb.emit_output(relax.Tuple([y, z]))
        bb.emit_func_output(out)
    mod = bb.get()
    data = np.random.default_rng(0).uniform(0, 1, (2, 3, 4)).astype("float32")
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    want = [w.numpy() for w in vm["main"](tvm.runtime.tensor(data))]
    func = mod["main"]
    values = {b.var: b.value for blk in func.body.blocks for b in blk.bindings}
    interp = Interpreter(values, missing=lambda v: data.astype(np.float64))
    for got, w in zip(interp(func.body.body), want):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6)


class _Styles(torch.nn.Module):
    """The same recurrence over time written with each way of taking a step's slice."""

    def __init__(self, style):
        super().__init__()
        self.style = style
        self.gate = torch.nn.Linear(D, D)

    def slices(self, x):
        n = x.shape[1]
        if self.style == "unbind":
            return x.unbind(1)
        if self.style == "split":
            return [s.squeeze(1) for s in x.split(1, dim=1)]
        if self.style == "chunk":
            return [s[:, 0] for s in x.chunk(n, 1)]
        if self.style == "narrow":
            return [x[:, t:t + 1].squeeze(1) for t in range(n)]
        return [x[:, t] for t in range(n)]

    def forward(self, x):
        h, hs = torch.zeros_like(x[:, 0]), []
        for x_t in self.slices(x):
            z = torch.sigmoid(self.gate(x_t)) if self.style == "linear gate" else torch.sigmoid(x_t)
            h = z * h + (1 - z) * x_t
            hs.append(h)
        return torch.stack(hs, dim=1)


@pytest.mark.parametrize("style", ["index", "unbind", "split", "chunk", "narrow", "linear gate"])
def test_loop_styles(style):
    model = _Styles(style).eval()
    args = (torch.randn(B, L, D, generator=torch.Generator().manual_seed(3)),)
    mod = sw.from_torch(model, args)
    found = sw.find_recurrences(mod)
    assert len(found) == 1 and found[0].length == L, sw.find_recurrences(mod, include_rejected=True)
    fused = sw.FuseAffineRecurrences()(mod)
    assert "relax.take" not in fused.script() and "strided_slice" not in fused.script() or style in (
        "narrow",), fused.script()[-3000:]
    assert_outputs_match(run_model(mod, args), torch_outputs(model, args))


@pytest.mark.parametrize("form", ["h + x", "a*h + b", "lerp"])
def test_only_the_last_state_used_writes_only_the_last_state(form):
    """Issue case 4: a running sum whose only use is its final value must not write all states."""
    step = {"h + x": lambda h, a, b: h + b, "a*h + b": lambda h, a, b: a * h + b,
            "lerp": lambda h, a, b: torch.lerp(h, b, a)}[form]
    model, args = _loop(step, stack=lambda hs: hs[-1] * 1.0), _args()
    mod = sw.from_torch(model, args)
    fused = sw.FuseAffineRecurrences()(mod)
    assert '\\"outputs\\": [\\"last\\"]' in fused.script(), fused.script()[-1500:]
    assert_outputs_match(run_model(mod, args), torch_outputs(model, args))


def test_max_stabilized_normalizer_is_one_reported_near_miss():
    """Issue case 10: RWKV/xLSTM's ``m = max(m + w, k_t)`` is not affine; say so, once per loop."""
    class MaxPlus(torch.nn.Module):
        def forward(self, k, w):
            m, ms = torch.full_like(k[:, 0], -1e4), []
            for t in range(k.shape[1]):
                m = torch.maximum(m + w, k[:, t])
                ms.append(m)
            return torch.stack(ms, 1)

    args = (torch.randn(2, L, D), torch.randn(D))
    model = MaxPlus().eval()
    mod = sw.from_torch(model, args)
    every = sw.find_recurrences(mod, include_rejected=True)
    maxplus = [r for r in every if "max-plus" in r.reason]
    assert len(maxplus) == 1 and maxplus[0].rejected and f"{L - 2} more steps" in maxplus[0].reason, every
    tvm.ir.assert_structural_equal(sw.FuseAffineRecurrences()(mod), mod)
    assert_outputs_match(run_model(mod, args), torch_outputs(model, args))


@pytest.mark.parametrize("reverse", [False, True])
def test_in_place_output_writes_become_the_stacked_states(reverse):
    """Issue cases 7 and 9: ``out[:, t] = h`` exports as a ``where`` over the whole buffer per
    step (O(L^2)); it must become the scan's states, with no per-step write left."""
    class InPlace(torch.nn.Module):
        def forward(self, a, b):
            out = b.new_empty(b.shape)
            h = torch.zeros_like(b[:, 0])
            steps = range(b.shape[1] - 1, -1, -1) if reverse else range(b.shape[1])
            for t in steps:
                h = a[:, t] * h + b[:, t]
                out[:, t] = h
            return out

    model, args = InPlace().eval(), _args((B, L, D))
    mod = sw.from_torch(model, args)
    fused = sw.FuseAffineRecurrences()(mod)
    assert fused.script().count('"scanweaver.affine_scan"') == 1
    assert "R.where" not in fused.script(), fused.script()[-2000:]
    assert_outputs_match(run_model(mod, args), torch_outputs(model, args))


@pytest.mark.parametrize("dim,reverse,start,gather", [
    (1, False, "h0", "stack"), (-1, True, "h0", "stack"), (0, False, "zeros", "stack"),
    (1, False, "h0", "cat"), (0, True, "zeros", "cat")])
def test_states_gathered_with_the_initial_state(dim, reverse, start, gather):
    """``hs = [h0]`` before the loop: the stacked states are the scan's output with the initial
    state in front, not L slices of it gathered again."""
    class Model(torch.nn.Module):
        def forward(self, h0, a, b):
            h = torch.zeros_like(h0) if start == "zeros" else h0
            hs = [h]
            steps = range(a.shape[1])
            for t in (reversed(steps) if reverse else steps):
                h = a[:, t] * h + b[:, t]
                hs.append(h)
            return torch.stack(hs, dim) if gather == "stack" else torch.cat(hs, dim)

    g = torch.Generator().manual_seed(3)
    args = (torch.randn(2, 3, generator=g), torch.rand(2, 9, 3, generator=g), torch.randn(2, 9, 3, generator=g))
    mod = sw.from_torch(Model().eval(), args)
    fused = sw.FuseAffineRecurrences()(mod)
    assert fused.script().count('"scanweaver.affine_scan"') == 1
    assert "R.take(" not in fused.script()          # no state read back one by one
    assert_outputs_match(run_model(mod, args), torch_outputs(Model().eval(), args))
