"""Trace short, compile once, run any length: ``sw.from_torch(..., dynamic_shapes=...)``.

Each model is traced at a few small sizes, fused, generalized to symbolic dims, compiled ONCE,
and that one executable is checked against PyTorch at lengths it was never traced at."""
import numpy as np
import pytest
import torch
import tvm
from tvm import relax

import scanweaver_tvm as sw
from scanweaver_tvm import models
from scanweaver_tvm.generalize import GeneralizeError

from harness import assert_outputs_match
from torch_models import Recurrence, inputs

Dim = torch.export.Dim
LENGTHS = (1, 2, 7, 100, 1000, 4097)


def executable(mod):
    return relax.VirtualMachine(sw.compile(mod, "llvm"), tvm.cpu())


def run(vm, args):
    out = vm["main"](*[tvm.runtime.tensor(a.numpy()) for a in args])
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


def expected(model, args):
    with torch.no_grad():
        out = model(*args)
    out = out if isinstance(out, (tuple, list)) else (out,)
    return [o.numpy() for o in out]


def params(mod):
    return [[str(getattr(d, "value", d)) for d in p.ty.shape.values] for p in mod["main"].params]


def scans(mod):
    return mod.script(show_meta=False).count("scanweaver.")


def test_ema_one_executable_for_every_length_and_batch():
    model, args = models.ema(length=5, batch=2)
    mod = sw.from_torch(model, args, dynamic_shapes={"x": {0: Dim("batch"), 1: Dim("L")}})
    assert params(mod) == [["batch", "L", "16"]]
    assert scans(mod) == 1
    vm = executable(mod)
    for batch in (1, 3):
        for length in LENGTHS:
            x = (torch.randn(batch, length, 16),)
            assert_outputs_match(run(vm, x), expected(model, x), rtol=1e-5)


def test_reversed_recurrence_with_initial_state():
    model = Recurrence("a*h+b", axis=1, reverse=True, init="input")
    L = Dim("L")
    mod = sw.from_torch(model, inputs(1, 9), dynamic_shapes=({1: L}, {1: L}, None))
    assert params(mod) == [["2", "L", "6"], ["2", "L", "6"], ["2", "6"]]
    vm = executable(mod)
    for length in LENGTHS:
        args = inputs(1, length, seed=length)
        assert_outputs_match(run(vm, args), expected(model, args), rtol=1e-5)


def test_linear_rnn_states_and_last_state():
    model, args = models.linear_rnn(length=5)
    B = Dim("batch")
    mod = sw.from_torch(model, args, dynamic_shapes=({0: B, 1: Dim("L")}, {0: B}))
    vm = executable(mod)
    for batch, length in [(1, 1), (3, 2), (1, 100), (3, 1025)]:
        x = (torch.randn(batch, length, 8), torch.randn(batch, 16))
        assert_outputs_match(run(vm, x), expected(model, x), rtol=1e-5)


def test_mamba_block_conv_padding_follows_length():
    """conv1d(padding=3) then ``[..., :L]``: the conv's output is L + 3 long."""
    model, args = models.mamba_block(length=6, batch=1)
    mod = sw.from_torch(model, args, dynamic_shapes=({0: Dim("batch"), 1: Dim("L")},))
    text = mod.script(show_meta=False)
    assert "L + 3" in text and "selective_scan" in text
    vm = executable(mod)
    for batch, length in [(1, 1), (3, 2), (1, 7), (3, 100), (1, 1000), (1, 4097)]:
        x = (torch.randn(batch, length, 32),)
        assert_outputs_match(run(vm, x), expected(model, x), rtol=1e-4)


def test_hf_mamba_one_executable():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.MambaConfig(vocab_size=64, hidden_size=32, state_size=8, num_hidden_layers=2,
                                   expand=2, conv_kernel=4)
    model = transformers.MambaForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (1, 9))
    mod = sw.from_torch(model, (ids,), dynamic_shapes={"input_ids": {0: Dim("batch"), 1: Dim("L")}})
    assert params(mod) == [["batch", "L"]]
    assert scans(mod) == 2
    vm = executable(mod)
    for batch in (1, 3):
        for length in LENGTHS:
            x = torch.randint(0, 64, (batch, length), generator=torch.Generator().manual_seed(length))
            with torch.no_grad():
                want = model(x, use_cache=False).logits.numpy()
            assert_outputs_match(run(vm, (x,))[:1], [want], rtol=1e-4)


def test_near_miss_cannot_generalize_and_says_why():
    """A tanh recurrence stays unrolled in each trace: the traces differ in size."""
    model = Recurrence("tanh", axis=1)
    with pytest.raises(GeneralizeError, match=r"number of bindings changes.*unrolled"):
        sw.from_torch(model, inputs(1, 9), dynamic_shapes=({1: Dim("L")}, {1: Dim("L")}, None))


class _PositionTable(torch.nn.Module):
    def forward(self, x):
        return x + torch.tensor([float(i) for i in range(x.shape[1])])[None, :, None]


class _EveryOther(torch.nn.Module):
    def forward(self, x):
        return x[:, ::2] * 2.0


def test_constant_whose_size_follows_length_is_a_clear_error():
    with pytest.raises(GeneralizeError, match=r"tensor constant whose shape follows the dims: \(5,\) at L=5, \(7,\) at L=7"):
        sw.from_torch(_PositionTable(), (torch.randn(2, 5, 3),), dynamic_shapes=({1: Dim("L")},))


def test_integer_that_is_not_affine_in_length_is_a_clear_error():
    with pytest.raises(GeneralizeError, match=r"is 3 at L=5, 4 at L=7, 6 at L=11 \(not a polynomial"):
        sw.from_torch(_EveryOther(), (torch.randn(2, 5, 3),), dynamic_shapes=({1: Dim("L")},))


def test_bad_dynamic_shapes_are_clear_errors():
    model, args = models.ema(length=5)
    with pytest.raises(ValueError, match="not one of the inputs"):
        sw.from_torch(model, args, dynamic_shapes={"y": {1: Dim("L")}})
    with pytest.raises(ValueError, match="rank 3, no dim 5"):
        sw.from_torch(model, args, dynamic_shapes=({5: Dim("L")},))
    with pytest.raises(ValueError, match="no three trace sizes"):
        sw.from_torch(model, args, dynamic_shapes=({1: Dim("L", max=5)},))


def test_fit_polynomials():
    from tvm import tirx

    from scanweaver_tvm.generalize_fit import _Fit, grid

    dims = {"B": tirx.Var("B", "int64"), "L": tirx.Var("L", "int64")}
    points = grid({"B": (2, 3, 5), "L": (7, 11, 13)})
    assert len(points) == 5 and points[-1] == {"B": 5, "L": 13}
    fit = _Fit(points, dims)
    assert fit.text([p["B"] * p["L"] for p in points]) == "B*L"
    assert fit.text([p["L"] + 3 for p in points]) == "L + 3"
    assert fit.text([2 * p["L"] - 1 for p in points]) == "2*L - 1"
    assert fit.text([p["L"] // 2 for p in points]) is None
    assert fit.text([p["L"] * p["L"] for p in points]) is None    # confirmed wrong at (5, 13)
    expr = fit.expr([p["B"] * p["L"] + p["B"] for p in points])
    assert [fit.evaluate(expr, {"B": b, "L": n}) for b, n in [(1, 1), (4, 100)]] == [2, 404]


def test_cli_compile_and_report_with_dynamic_dims(tmp_path, capsys):
    from scanweaver_tvm import cli

    out = tmp_path / "ema.so"
    code = cli.main(["compile", "scanweaver_tvm.models:ema", "--dynamic-dim", "x:0",
                     "--dynamic-dim", "x:1", "-o", str(out), "-q"])
    text = capsys.readouterr().out
    assert code == 0 and "entry: main(x: float32[batch, L, 16])" in text, text
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(out)), tvm.cpu())
    model, _ = models.ema()
    x = (torch.randn(3, 77, 16),)
    assert_outputs_match(run(vm, x), expected(model, x), rtol=1e-5)
    code = cli.main(["report", "scanweaver_tvm.models:ema", "--dynamic-dim", "0:1=seq", "-q"])
    text = capsys.readouterr().out
    assert code == 0 and "x: float32[2, seq, 16]" in text and "L=seq" in text and "fused in every trace" in text, text
    assert cli.main(["report", "scanweaver_tvm.models:ema", "--dynamic-dim", "x1", "-q"]) == 2
    assert "--dynamic-dim x1: expected INPUT:DIM" in capsys.readouterr().err


@pytest.mark.parametrize("factory", [models.ema, models.mamba_block])
def test_generalized_model_builds_for_cuda(factory):
    """The same module for CUDA sm_90: its CUDA source passes ptxas (the GPU run is in bench/gpu,
    still to do for symbolic dims)."""
    from tir_schedules import cuda_check

    model, args = factory(length=6, batch=2)
    mod = sw.from_torch(model, args, dynamic_shapes=({0: Dim("batch"), 1: Dim("L")},))
    source = "\n".join(cuda_check.module_cuda_sources(sw.compile(mod, cuda_check.SM90).mod))
    assert "scanweaver_scan" in source
    report = cuda_check.ptxas(cuda_check.ptx(source))
    assert report.spill_stores == 0 and report.spill_loads == 0, report.text


def test_generalized_length_through_the_mlir_route():
    model, args = models.ema(length=5, batch=2)
    mod = sw.from_torch(model, args, dynamic_shapes=({1: Dim("L")},))
    vm = relax.VirtualMachine(sw.compile(mod, "llvm", realization="mlir"), tvm.cpu())
    for length in (1, 7, 1000):
        x = (torch.randn(2, length, 16),)
        assert_outputs_match(run(vm, x), expected(model, x), rtol=1e-5)
    batch = sw.from_torch(model, args, dynamic_shapes=({0: Dim("batch"), 1: Dim("L")},))
    with pytest.raises(ValueError, match="symbolic .* not supported yet; use realization='tir'"):
        sw.compile(batch, "llvm", realization="mlir")


class LastWindow(torch.nn.Module):
    """A conv cache's update: the last 4 steps of the input (``x[..., -4:]``) and the input
    from ``-L`` (``x[:, -x.shape[1]:]``, HF Mamba's slice after its cached conv)."""

    def forward(self, x):
        return x[..., -4:, :] * 2.0, x[:, -x.shape[1]:] + 1.0


def test_slices_from_the_end_are_static_under_the_dims_min():
    """With ``Dim("L", min=4)`` the last-4 window has the static shape (1, 4, 8) (its bounds
    rewritten from the start, in bounds for every L >= 4) and ``-L:`` is the whole axis; the
    executable is right at lengths never traced."""
    model = LastWindow()
    x = torch.randn(1, 9, 8)
    mod = sw.from_torch(model, (x,), dynamic_shapes={"x": {1: Dim("L", min=4)}})
    assert [int(d) for d in mod["main"].ret_ty.fields[0].shape.values] == [1, 4, 8]
    assert "if_then_else" not in mod.script(show_meta=False)
    vm = executable(mod)
    for length in (4, 5, 64, 1001):
        args = (torch.randn(1, length, 8),)
        assert_outputs_match(run(vm, args), expected(model, args), rtol=1e-6)


class _PackedCheck(torch.nn.Module):
    """transformers' packed-sequence check: positions' steps counted with an int64 cumsum,
    and the last entries read through a negative axis."""
    def forward(self, x):
        pos = torch.arange(x.shape[1])[None]
        starts = (torch.diff(pos, dim=-1, prepend=pos[:, :1] - 1) != 1).cumsum(-1)
        return x * starts[..., None] + x[..., -2:].sum(-1, keepdim=True)


def test_integer_cumsum_and_negative_axis_slice_over_symbolic_length():
    """Two TVM 0.27 failures met on Qwen3-Next at a symbolic L: a negative slice axis ("axis <
    src_tensor_dim (-1 vs. 2)") and the CPU pipeline's copy of a legalized cumsum ("variables
    (L,) are used, but are not passed in as API arguments")."""
    model = _PackedCheck()
    mod = sw.from_torch(model, (torch.randn(1, 5, 3),), dynamic_shapes=({1: Dim("L")},))
    vm = executable(mod)
    for length in (1, 6, 100):
        x = torch.randn(1, length, 3)
        assert_outputs_match(run(vm, (x,))[:1], [model(x).numpy()], rtol=1e-6)


@pytest.mark.parametrize("family", ["qwen3_next", "kimi_linear"])
def test_chunked_delta_models_generalize_over_length(family):
    """Their chunk padding (to a multiple of 64) depends on L; once the chunked region is a
    scan over L the padding goes (``unpad``) and one module serves every length."""
    from scanweaver_tvm.causal_lm import torch_kernels
    from test_causal_lm_hybrids import FAMILIES

    torch.manual_seed(0)
    model = FAMILIES[family][0]().eval()
    mod = sw.from_torch(model, (torch.randint(0, 64, (1, 20)),), dynamic_shapes={"input_ids": {1: Dim("L")}})
    assert mod.script(show_meta=False).count("scanweaver.delta_scan") == 1
    vm = executable(mod)
    for length in (3, 64, 65, 130):
        x = torch.randint(0, 64, (1, length), generator=torch.Generator().manual_seed(length))
        with torch.no_grad(), torch_kernels():
            want = model(x, use_cache=False).logits.numpy()
        assert_outputs_match(run(vm, (x,))[:1], [want], rtol=1e-4)


class _Position(torch.nn.Module):
    """A position read from a shape, as a cache's ``arange(1) + seen``: a constant per trace."""
    def forward(self, x):
        return x + torch.tensor([x.shape[1], x.shape[1] + 1]).to(x.dtype)


class _Scaled(torch.nn.Module):
    def forward(self, x):
        return x + torch.tensor([x.shape[1], 2 * x.shape[1]], dtype=x.dtype)


def test_positions_that_follow_the_length_become_arange():
    model = _Position()
    mod = sw.from_torch(model, (torch.randn(3, 5, 2),), dynamic_shapes=({1: Dim("L")},))
    assert "R.arange(L, L + 2" in mod.script(show_meta=False)
    vm = executable(mod)
    for length in (1, 9):
        x = torch.randn(3, length, 2)
        assert_outputs_match(run(vm, (x,))[:1], [model(x).numpy()], rtol=1e-6)


def test_values_that_follow_the_length_but_are_no_positions_are_a_clear_error():
    with pytest.raises(GeneralizeError, match=r"tensor constant whose values follow the dims \(shape \(2,\)"):
        sw.from_torch(_Scaled(), (torch.randn(3, 5, 2),), dynamic_shapes=({1: Dim("L")},))


class _PadToWindow(torch.nn.Module):
    """``F.pad(x, (w - L, 0))``, the conv-window idiom (RecurrentGemma's cache after a
    prompt): the last w positions at L >= w."""
    def forward(self, x):
        return torch.nn.functional.pad(x, (3 - x.shape[-1], 0)) * 2.0


class _Crops(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.pad(x, (1, -2, -1, 2), value=0.5), torch.nn.functional.pad(x, (-2, -3))


def test_negative_pad_is_a_slice_that_generalizes():
    """Traced at L = 4, 6, 8 (pad amounts -1, -3, -5), one executable keeps the last three
    positions at every L >= 3, as PyTorch crops; crops at both ends of fixed sizes, padded
    where positive, as PyTorch."""
    model = _PadToWindow()
    mod = sw.from_torch(model, (torch.randn(2, 5, 8),), dynamic_shapes={"x": {2: Dim("L", min=3)}},
                        trace_sizes={"L": [4, 6, 8]})
    vm = executable(mod)
    for length in (3, 4, 9, 1000):
        args = (torch.randn(2, 5, length),)
        assert_outputs_match(run(vm, args), expected(model, args), rtol=1e-6)
    args = (torch.randn(2, 5, 9),)
    assert_outputs_match(run(executable(sw.from_torch(_Crops(), args)), args), expected(_Crops(), args), rtol=1e-6)


class _ConvThenLoop(torch.nn.Module):
    """A recurrence over a convolution's output, its states written into a buffer made from
    that output (``torch.zeros_like``: RG-LRU's ``contextualized_states``)."""
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(8, 8, 4, groups=8, padding=3)

    def forward(self, x):
        u = self.conv(x.transpose(1, 2))[..., :x.shape[1]].transpose(1, 2)
        a = torch.sigmoid(u)
        out, h = torch.zeros_like(u), torch.zeros_like(u[:, 0])
        for t in range(u.shape[1]):
            h = a[:, t] * h + u[:, t]
            out[:, t] = h
        return out


def test_states_written_into_a_buffer_made_upstream():
    """The in-place writes are the scan's stacked states whatever made the buffer (here a
    convolution, which the pass's evaluator does not run): fused, generalized over L."""
    model = _ConvThenLoop().eval()
    mod = sw.from_torch(model, (torch.randn(1, 6, 8),), dynamic_shapes={"x": {1: Dim("L", min=2)}})
    assert scans(mod) == 1
    vm = executable(mod)
    for length in (2, 7, 100):
        args = (torch.randn(1, length, 8),)
        assert_outputs_match(run(vm, args), expected(model, args), rtol=1e-4)
