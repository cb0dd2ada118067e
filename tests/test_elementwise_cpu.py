"""``tir_schedules.elementwise_cpu.ElementwiseCPU``: injective PrimFuncs as one parallel,
vectorized loop (and the AVX2 build failure of an unscheduled two-stage function)."""
import numpy as np
import pytest
import torch
import tvm
from tvm import relax, tirx
from tvm.relax.backend.cpu_generic import pipeline as cpu
from tvm.s_tir import dlight as dl

import scanweaver_tvm as sw
from harness import assert_outputs_match, run_model, torch_outputs
from tir_schedules import dense_cpu
from tir_schedules.elementwise_cpu import LANES, PARALLEL_MIN, ElementwiseCPU

AVX2 = tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})


class Silu(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.silu(x)


def legalized(model, x, rule=True):
    """``model`` imported (on ``x``, or on the list of inputs ``x``), legalized and fused as TVM's
    CPU pipeline does; with ``rule``, the elementwise rule applied."""
    mod = sw.from_torch(model, x if isinstance(x, list) else [x])
    with AVX2:
        passes = cpu.legalize_passes(AVX2) + ([dl.ApplyDefaultSchedule(ElementwiseCPU())] if rule else [])
        return tvm.transform.Sequential(passes)(mod)


def prim_funcs(mod):
    """The module's PrimFuncs, each callable alone as ``main``."""
    return {gv.name_hint: f.with_attr("global_symbol", "main") for gv, f in mod.functions_items()
            if isinstance(f, tirx.PrimFunc)}


def test_two_stage_silu_builds_for_avx2_once_scheduled():
    """The unscheduled (4, 3, 3) silu (sigmoid, then multiply) fails LLVM's verifier on AVX2
    targets in TVM 0.27; inlined into one loop it builds and computes silu."""
    x = torch.randn(4, 3, 3)
    (before,) = prim_funcs(legalized(Silu(), x, rule=False)).values()
    with pytest.raises(Exception, match="verification failed"):
        tvm.compile(tvm.IRModule({"main": before}), target=AVX2)
    (after,) = prim_funcs(legalized(Silu(), x)).values()
    text = after.script()
    assert text.count("T.sblock(") - text.count('T.sblock("root")') == 1      # one stage
    lib = tvm.compile(tvm.IRModule({"main": after}), target=AVX2)
    out = tvm.runtime.tensor(np.full((4, 3, 3), np.nan, "float32"))
    lib["main"](tvm.runtime.tensor(x.numpy()), out)
    np.testing.assert_allclose(out.numpy(), Silu()(x).numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape,parallel,vectorized", [
    ((4, 3, 3), False, False),            # 36 elements: not a multiple of the lanes, too few for threads
    ((8, 64), False, True),               # 512: vectorized, still on one thread
    ((64, 4096), True, True),             # above PARALLEL_MIN and a multiple of LANES
    ((129, 131), True, False),            # above PARALLEL_MIN, ragged: parallel, not vectorized
])
def test_loops_are_fused_split_and_annotated(shape, parallel, vectorized):
    x = torch.randn(*shape)
    (func,) = prim_funcs(legalized(Silu(), x)).values()
    text = func.script()
    size = int(np.prod(shape))
    assert ("T.parallel(" in text) == parallel == (size >= PARALLEL_MIN)
    assert ("T.vectorized(" in text) == vectorized == (size % LANES == 0)
    assert_outputs_match(run_model(sw.from_torch(Silu(), [x]), [x]), torch_outputs(Silu(), [x]), rtol=1e-6)


def test_reductions_are_left_to_other_rules():
    class Softmax(torch.nn.Module):
        def forward(self, x):
            return torch.softmax(x, -1)
    x = torch.randn(64, 512)
    funcs = prim_funcs(legalized(Softmax(), x))
    assert funcs and not any("T.parallel(" in f.script() for f in funcs.values())


@pytest.mark.parametrize("rows", [1, 3])
def test_a_reduction_over_one_term_is_not_taken_for_elementwise(rows):
    """``Linear(1, 1)``: its matmul normalizes to a block with no reduce axis but an init;
    had the rule inlined the bias into it, the bias would join both its init and its update
    (added twice: fuzz case 1035)."""
    model = torch.nn.Linear(1, 1).eval()
    x = torch.randn(rows, 1)
    funcs = legalized(model, x, rule=False)
    matmuls = [f for f in prim_funcs(funcs).values() if "T.init()" in f.script()]
    assert matmuls and all(ElementwiseCPU().apply(f, AVX2, False) is None for f in matmuls)
    assert_outputs_match(run_model(sw.from_torch(model, [x]), [x]), torch_outputs(model, [x]), rtol=1e-6)


class BroadcastSoftplus(torch.nn.Module):
    """A Mamba decode step's discretization: softplus(dt) per channel, read twice per (channel,
    state) element (``cheap``: dt itself, with no transcendental)."""

    def __init__(self, cheap=False):
        super().__init__()
        self.cheap = cheap

    def forward(self, dt, a, h):
        delta = dt * 2.0 if self.cheap else torch.nn.functional.softplus(dt)
        return h * torch.exp(delta[:, None] * a) + delta[:, None]


@pytest.mark.parametrize("cheap", [False, True])
def test_a_costly_stage_broadcast_to_the_output_is_computed_once(cheap):
    rows, state = 1536, 16
    args = [torch.randn(rows), -torch.rand(rows, state), torch.randn(rows, state)]
    model = BroadcastSoftplus(cheap)
    (text,) = [f.script() for f in prim_funcs(legalized(model, args)).values() if "T.exp(" in f.script()]
    kept = f"T.sblock_alloc_buffer((T.int64({rows}),))" in text
    assert kept != cheap and text.count("T.log(") == (0 if cheap else 1)
    assert_outputs_match(run_model(sw.from_torch(model, args), args), torch_outputs(model, args), rtol=1e-6)


def test_symbolic_length_compiles_once_and_runs_at_every_length():
    class Gate(torch.nn.Module):
        def forward(self, x, z):
            return x * torch.sigmoid(z) + 1.0
    x, z = torch.randn(2, 37, 48), torch.randn(2, 37, 48)
    mod = sw.from_torch(Gate(), [x, z], dynamic_shapes={"x": {1: "L"}, "z": {1: "L"}})
    vm = relax.VirtualMachine(sw.compile(mod, "llvm"), tvm.cpu())
    for length in (1, 5, 300):
        a, b = torch.randn(2, length, 48), torch.randn(2, length, 48)
        got = vm["main"](tvm.runtime.tensor(a.numpy()), tvm.runtime.tensor(b.numpy()))
        got = got.numpy() if hasattr(got, "numpy") else got[0].numpy()
        np.testing.assert_allclose(got, Gate()(a, b).numpy(), rtol=1e-6, atol=1e-6)


class TransposeSplit(torch.nn.Module):
    """A conv output brought back to (B, L, C) and split into sections (Qwen3-Next's q, k, v)."""

    def forward(self, x):
        q, k, v = torch.split(x.transpose(1, 2), [64, 64, 128], dim=-1)
        return q + 0.0, k * 2.0, v - 1.0


def test_a_splits_sections_are_each_one_parallel_loop():
    """A transpose feeding a split: the transpose inlined into each section, every section's
    loop parallel and vectorized, the outputs equal to PyTorch's."""
    x = torch.randn(1, 256, 512)
    funcs = prim_funcs(legalized(TransposeSplit(), x))
    (split,) = [f for name, f in funcs.items() if "split" in name]
    text = split.script()
    assert text.count("T.parallel(") == 3 and text.count("T.vectorized(") == 3
    assert "T_transpose" not in text                                       # inlined into each section
    assert_outputs_match(run_model(sw.from_torch(TransposeSplit(), [x]), [x]),
                         torch_outputs(TransposeSplit(), [x]), rtol=1e-6)


def test_norms_and_depthwise_convs_get_dlights_reduction_rule():
    """``dense_cpu.schedule_passes`` hands what no rule of ours takes (an RMS norm, a depthwise
    causal conv with its activation) to DLight's CPU ``Reduction`` rule: parallel, and equal."""
    class ConvNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv1d(256, 256, 4, groups=256, padding=3)

        def forward(self, x):
            h = torch.nn.functional.silu(self.conv(x.transpose(1, 2))[..., :x.shape[1]]).transpose(1, 2)
            return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.manual_seed(0)
    model, x = ConvNorm().eval(), torch.randn(1, 300, 256)
    mod = sw.from_torch(model, [x])
    with AVX2:
        mod = tvm.transform.Sequential(cpu.legalize_passes(AVX2) + dense_cpu.schedule_passes()[:2])(mod)
    texts = {name: f.script() for name, f in prim_funcs(mod).items()}
    for name in [n for n in texts if "conv1d" in n or "mean" in n]:
        assert "T.parallel(" in texts[name], name
    assert any("conv1d" in n for n in texts) and any("mean" in n for n in texts)
    assert_outputs_match(run_model(sw.from_torch(model, [x]), [x]), torch_outputs(model, [x]), rtol=1e-5)


class Transpose(torch.nn.Module):
    def forward(self, x):
        return x.transpose(1, 2) + 1.0


@pytest.mark.parametrize("shape", [(1, 1536, 512), (2, 37, 300), (3, 8, 40)])
def test_transposes_are_walked_in_tiles(shape):
    """(B, D, L) -> (B, L, D): 16 x 16 tiles, the inner axis vectorized when 16 divides it;
    too short an axis (8) keeps the plain loop; equal to PyTorch, ragged edges included."""
    x = torch.randn(*shape)
    (func,) = prim_funcs(legalized(Transpose(), x)).values()
    text = func.script()
    tiled = min(shape[1:]) >= 16
    rows = "in range(T.int64(16))" in text or "T.grid(T.int64(16), T.int64(16))" in text
    assert rows == tiled, text                                                # a tile's rows
    assert ("T.vectorized(" in text) == (shape[1] % 16 == 0 if tiled else np.prod(shape) % LANES == 0)
    assert_outputs_match(run_model(sw.from_torch(Transpose(), [x]), [x]), torch_outputs(Transpose(), [x]), rtol=1e-6)


def test_a_transpose_over_a_symbolic_length_is_tiled_and_right_at_every_length():
    x = torch.randn(1, 48, 37)
    mod = sw.from_torch(Transpose(), [x], dynamic_shapes={"x": {2: "L"}})
    with AVX2:
        scheduled = tvm.transform.Sequential(cpu.legalize_passes(AVX2) + [dl.ApplyDefaultSchedule(ElementwiseCPU())])(mod)
    (func,) = prim_funcs(scheduled).values()
    assert "T.grid(T.int64(16), T.int64(16))" in func.script() or "in range(T.int64(16))" in func.script()
    vm = relax.VirtualMachine(sw.compile(mod, "llvm"), tvm.cpu())
    for length in (1, 16, 17, 300):
        a = torch.randn(1, 48, length)
        got = vm["main"](tvm.runtime.tensor(a.numpy()))
        got = got.numpy() if hasattr(got, "numpy") else got[0].numpy()
        np.testing.assert_array_equal(got, Transpose()(a).numpy())


class ToChannelsFirst(torch.nn.Module):
    """(B, L, C) -> (B, C, L), as a conv's input (the innermost axis becomes the symbolic L)."""

    def forward(self, x):
        return x.transpose(1, 2) * 2.0


class HeadsFirst(torch.nn.Module):
    """(B, L, H, D) -> (B, H, L, D), as a scan's operands (L symbolic, D innermost throughout)."""

    def forward(self, x):
        return x.transpose(1, 2) + 1.0


@pytest.mark.parametrize("model,shape", [(ToChannelsFirst(), (1, 37, 64)), (HeadsFirst(), (1, 37, 4, 32))],
                         ids=["transpose", "permute"])
def test_symbolic_length_layout_changes_are_vectorized(model, shape):
    """With L symbolic, the loops after it are vectorized apart from it: fused with L, every
    element would divide its index by L and nothing would be vectorized (Qwen3.5's GDN operands
    at 4 GB/s).  A transpose whose innermost axis is L vectorizes the static axis (strided
    writes).  Equal to PyTorch at every length, ragged tiles included."""
    x = torch.randn(*shape)
    mod = sw.from_torch(model, [x], dynamic_shapes={"x": {1: "L"}})
    with AVX2:
        scheduled = tvm.transform.Sequential(cpu.legalize_passes(AVX2) + [dl.ApplyDefaultSchedule(ElementwiseCPU())])(mod)
    (func,) = prim_funcs(scheduled).values()
    assert "T.vectorized(T.int64(16))" in func.script(), func.script()
    vm = relax.VirtualMachine(sw.compile(mod, "llvm"), tvm.cpu())
    for length in (1, 16, 17, 300):
        a = torch.randn(1, length, *shape[2:])
        got = vm["main"](tvm.runtime.tensor(a.numpy()))
        got = got.numpy() if hasattr(got, "numpy") else got[0].numpy()
        np.testing.assert_array_equal(got, model(a).numpy())


class CausalConv(torch.nn.Module):
    """Mamba's depthwise causal conv with its bias, the slice back to L and SiLU."""

    def __init__(self, channels=64, taps=4):
        super().__init__()
        self.conv = torch.nn.Conv1d(channels, channels, taps, groups=channels, padding=taps - 1)

    def forward(self, x):
        return torch.nn.functional.silu(self.conv(x)[..., :x.shape[-1]])


@pytest.mark.parametrize("length", [61, 509])
def test_depthwise_conv_rows_in_parallel_taps_outside(length):
    """``ShortReductionCPU``: one parallel loop over the channels, the 4 taps outside the row's
    positions, the SiLU epilogue per row; equal to PyTorch."""
    torch.manual_seed(0)
    model, x = CausalConv(512).eval(), torch.randn(1, 512, length)        # above PARALLEL_MIN
    mod = sw.from_torch(model, [x])
    with AVX2:
        mod = tvm.transform.Sequential(cpu.legalize_passes(AVX2) + dense_cpu.schedule_passes()[:2])(mod)
    (text,) = [f.script() for name, f in prim_funcs(mod).items() if "conv1d" in name]
    assert text.count("T.parallel(") == 1 and "T.grid(T.int64(4), T.int64(" in text, text
    assert_outputs_match(run_model(sw.from_torch(model, [x]), [x]), torch_outputs(model, [x]), rtol=1e-5)
