"""The CPU dense-layer rule (``tir_schedules.dense_cpu``): what it schedules, and that the
scheduled layers compute what PyTorch does, at ragged sizes, batched, with epilogues."""
import numpy as np
import pytest
import torch
import tvm
from tvm import relax, tirx
from tvm.script import tirx as T

import scanweaver_tvm as sw
from scanweaver_core.targets import host_target
from tir_schedules import dense_cpu
from tvm.relax.backend.cpu_generic import pipeline as cpu

from harness import assert_outputs_match, run_model, torch_outputs


class Dense(torch.nn.Module):
    def __init__(self, k, n, bias=True, act=None):
        super().__init__()
        self.lin = torch.nn.Linear(k, n, bias=bias)
        self.act = act

    def forward(self, x):
        y = self.lin(x)
        return self.act(y) if self.act is not None else y


class Bmm(torch.nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b) + a.sum(-1, keepdim=True)


def scheduled(mod):
    """``mod`` legalized and fused as TVM's CPU pipeline does, then our schedule passes."""
    target = host_target()
    with target:
        return tvm.transform.Sequential(cpu.legalize_passes(target) + dense_cpu.schedule_passes())(mod)


def matmul_funcs(mod):
    return [f.script() for _, f in mod.functions_items()
            if not isinstance(f, relax.Function) and "matmul" in f.script()]


@pytest.mark.parametrize("m,k,n", [(1, 8, 40), (7, 33, 96), (16, 64, 80), (3, 5, 7), (9, 48, 1000)])
@pytest.mark.parametrize("act", [None, torch.nn.functional.silu], ids=["plain", "silu"])
def test_linear_layers_match_pytorch(m, k, n, act):
    torch.manual_seed(m * n + k)
    model = Dense(k, n, act=act).eval()
    x = torch.randn(2, m, k)
    mod = sw.from_torch(model, [x])
    funcs = matmul_funcs(scheduled(mod))
    assert funcs and all("T.parallel" in f and "T.vectorized" in f for f in funcs), funcs
    assert_outputs_match(run_model(mod, [x]), torch_outputs(model, [x]), rtol=1e-5)


class Readout(torch.nn.Module):
    def forward(self, h, c):
        return h @ c


def test_a_matrix_times_a_vector_is_left_to_the_reduction_rules():
    """``h @ C`` with one column (a Mamba decode step's readout of its state): a register tile
    would be 1 column of NR, so the dense rule leaves it to the next rules (a serial loop of
    its few multiply-adds where none takes it); it equals PyTorch."""
    args = [torch.randn(1, 96, 16), torch.randn(1, 16, 1)]
    mod = sw.from_torch(Readout(), args)
    rules = [(f.attrs or {}).get("scanweaver.rule") for _, f in scheduled(mod).functions_items()
             if not isinstance(f, relax.Function) and "matmul" in f.script()]
    assert rules and "DenseCPU" not in rules, rules
    assert_outputs_match(run_model(mod, args), torch_outputs(Readout(), args), rtol=1e-5)


def test_constant_weight_is_packed_once_at_compile_time():
    model = Dense(64, 80, bias=False).eval()
    mod = scheduled(sw.from_torch(model, [torch.randn(1, 5, 64)]))
    consts, callees = [], []

    def visit(e):
        if isinstance(e, tvm.ir.GenericConst):
            consts.append(tuple(e.value.shape))
        if isinstance(e, relax.Call) and isinstance(e.args[0] if e.args else None, tvm.ir.GlobalVar):
            callees.append(e.args[0].name_hint)

    relax.analysis.post_order_visit(mod["main"], visit)
    # the weight reaches the matmul as (N / NR, K, NR) panels, N = 80 padded to a multiple of NR
    nr = dense_cpu.register_tile(host_target()).cols
    assert (-(-80 // nr) * nr // nr, 64, nr) in consts, consts
    assert not [c for c in callees if "prepack" in c and "prepacked" not in c], callees   # folded


def test_matmul_of_two_activations_matches_pytorch():
    a, b = torch.randn(3, 5, 6), torch.randn(3, 6, 37)
    mod = sw.from_torch(Bmm(), [a, b])
    assert matmul_funcs(scheduled(mod))
    assert_outputs_match(run_model(mod, [a, b]), torch_outputs(Bmm(), [a, b]), rtol=1e-5)


def test_non_matmul_reductions_are_left_alone():
    class Norm(torch.nn.Module):
        def forward(self, x):
            return x / x.pow(2).sum(-1, keepdim=True).sqrt()

    x = torch.randn(4, 33)
    mod = sw.from_torch(Norm(), [x])
    assert all("T.parallel" not in f.script() for _, f in scheduled(mod).functions_items()
               if not isinstance(f, relax.Function))
    assert_outputs_match(run_model(mod, [x]), torch_outputs(Norm(), [x]), rtol=1e-5)


# --- symbolic rows: one compiled matmul for every sequence length (and batch) ---------------------

def _symbolic_dense(shape, k, n, epilogue=False, seed=0):
    """``x @ W`` (``+ b``, GELU with ``epilogue``) for ``x`` of ``shape + (k,)``, ``shape`` holding
    ``tirx.Var``s; the module, and the numpy reference as a function of ``x``."""
    rng = np.random.default_rng(seed)
    w, b = rng.standard_normal((k, n)).astype("float32"), rng.standard_normal(n).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((*shape, k), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.const(w)))
            if epilogue:
                y = bb.emit(relax.op.nn.gelu(relax.op.add(y, relax.const(b))))
            out = bb.emit_output(y)
        bb.emit_func_output(out)

    def reference(a):
        y = a.astype("float64") @ w
        if epilogue:
            y = y + b
            y = 0.5 * y * (1 + torch.erf(torch.from_numpy(y) / np.sqrt(2)).numpy())
        return y

    return bb.get(), reference


def _check_symbolic(mod, reference, shapes):
    funcs = matmul_funcs(scheduled(mod))
    assert funcs and all("T.parallel" in f and "T.vectorized" in f for f in funcs), funcs
    ex = sw.compile(mod, "llvm")
    # one "may alias" TBAA tag on every access (a function without tirx.noalias leaking onto the
    # kernels: see dense_cpu._mark_single_pointer_funcs_noalias) would cost the kernel its
    # accumulator registers
    assert "tvm-alias" not in ex.mod.imports[0].inspect_source("ll")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    rng = np.random.default_rng(1)
    for shape in shapes:
        a = rng.standard_normal(shape).astype("float32")
        out = vm["main"](tvm.runtime.tensor(a)).numpy()
        np.testing.assert_allclose(out, reference(a), rtol=1e-4, atol=1e-4, err_msg=str(shape))


ROWS = [1, 2, 7, 8, 9, 100, 1023]


def test_symbolic_rows_matmul_is_scheduled_and_matches_numpy():
    mod, reference = _symbolic_dense([tirx.Var("L", "int64")], 64, 80)
    _check_symbolic(mod, reference, [(rows, 64) for rows in ROWS])


def test_symbolic_rows_matmul_with_bias_and_activation():
    mod, reference = _symbolic_dense([tirx.Var("L", "int64")], 48, 96, epilogue=True)
    _check_symbolic(mod, reference, [(rows, 48) for rows in ROWS])


def test_symbolic_batch_and_rows_matmul():
    batch, length = tirx.Var("batch", "int64"), tirx.Var("L", "int64")
    mod, reference = _symbolic_dense([batch, length], 40, 64, epilogue=True)
    _check_symbolic(mod, reference, [(b, rows, 40) for b, rows in [(1, 1), (2, 7), (3, 9), (1, 100), (2, 1023), (5, 8)]])


def test_single_buffer_functions_are_marked_noalias():
    """``VMShapeLower``'s ``shape_func`` (one buffer: nothing to alias) leaves ``cpu_pipeline``
    marked ``tirx.noalias``; a function with two buffers, which may alias, is left as it was."""
    mod, _ = _symbolic_dense([tirx.Var("L", "int64")], 16, 32)
    lowered = dense_cpu.cpu_pipeline(host_target())(mod)
    funcs = {gv.name_hint: f for gv, f in lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    assert "shape_func" in funcs and funcs["shape_func"].attrs["tirx.noalias"], funcs.keys()

    @T.prim_func(s_tir=True)
    def copy(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
        for i in range(4):
            b[i] = a[i]

    marked = dense_cpu._mark_single_pointer_funcs_noalias(tvm.IRModule({"copy": copy}))
    assert "tirx.noalias" not in (marked["copy"].attrs or {})


def test_register_tile_fits_the_target_registers():
    """AVX-512's 32 zmm registers take the 8 x 32 tile; AVX2's 16 ymm take 4 x 16 (8 x 32 would
    be 32 accumulators, spilled on every k)."""
    wide = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids"})
    narrow = tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})
    assert dense_cpu.register_tile(wide) == dense_cpu.RegisterTile(8, 32)
    assert dense_cpu.register_tile(narrow) == dense_cpu.RegisterTile(4, 16)
    mod = sw.from_torch(Dense(48, 70).eval(), [torch.randn(2, 9, 48)])
    for target in (wide, narrow):          # both build (only the host's can run here)
        assert sw.compile(mod, target=target) is not None


@pytest.mark.parametrize("mcpu", ["haswell", "znver3"])
def test_avx2_tiles_match_pytorch(mcpu):
    """A ragged Linear + GELU (rows and columns padded to the 4 x 16 tile) compiled for an
    AVX2 CPU (every x86-64 host this runs on has AVX2) equals PyTorch."""
    model = Dense(48, 70, act=torch.nn.functional.gelu).eval()
    x = torch.randn(2, 9, 48)
    mod = sw.from_torch(model, [x])
    got = run_model(mod, [x], target={"kind": "llvm", "mcpu": mcpu})
    assert_outputs_match(got, torch_outputs(model, [x]), rtol=1e-5)


@pytest.mark.parametrize("mcpu", ["znver3", "znver4", "sapphirerapids"])
def test_bf16_linear_is_scheduled_with_its_weight_kept_bf16(mcpu):
    """A bf16 Linear (as a bf16 checkpoint loads) is scheduled by the dense rule (TVM's bf16
    legalization accepts the scheduled function) with its packed weight in bf16.  AVX2
    (znver3): the activations reach the tiles widened to float32 (``widen``).  AVX512-BF16
    (znver4, sapphirerapids): they stay bf16 and the tiles multiply with ``vdpbf16ps``
    (``bf16_dot``; the weight packed in k pairs), checked in the assembly.  Run where the host
    has the target's features: within bf16 rounding of the float64 result on the same bf16
    values (the Linear and the SiLU each round to bf16)."""
    import ml_dtypes
    from tir_schedules import bf16_dot

    torch.manual_seed(3)
    model = Dense(64, 80, act=torch.nn.functional.silu).to(torch.bfloat16).eval()
    x = torch.randn(2, 9, 64).to(torch.bfloat16)
    mod = sw.from_torch(model, [x])
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "mtriple": "x86_64-linux-gnu"})
    dot = mcpu != "znver3"
    assert bf16_dot.available(target) == dot
    with target:
        fused = tvm.transform.Sequential(dense_cpu.tunable_passes(target) + dense_cpu.schedule_passes())(mod)
    dense = [f for g, f in fused.functions_items() if g.name_hint.endswith("_prepacked")]  # (it reads the packed weight)
    assert len(dense) == 1 and dense[0].attrs["scanweaver.rule"] == "DenseCPU"
    activation, weight = [p for p in dense[0].params if len(p.ty.shape) > 1][:2]          # (x, packed W)
    assert str(activation.ty.dtype) == ("bfloat16" if dot else "float32")
    assert str(weight.ty.dtype) == "bfloat16" and len(weight.ty.shape) == (4 if dot else 3)
    ex = sw.compile(mod, target)
    assert ("vdpbf16ps" in ex.mod.imports[0].inspect_source("asm")) == dot
    if not bf16_dot.available(host_target()) and dot:
        return                                        # (compiled and read; this CPU cannot run it)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x.float().numpy().astype(ml_dtypes.bfloat16)))
    got = np.asarray((out[0] if not hasattr(out, "numpy") else out).numpy(), dtype=np.float64)
    lin = model.lin
    y = x.double() @ lin.weight.detach().double().T + lin.bias.detach().double()
    want = torch.nn.functional.silu(y).numpy()
    assert np.abs(got - want).max() / np.abs(want).max() <= 2 ** -7


@pytest.mark.parametrize("m,k,n", [(1, 63, 40), (5, 33, 96), (3, 768, 64)])
def test_bf16_dot_on_odd_depths_few_rows_and_ragged_columns(m, k, n):
    """The vdpbf16ps tiles with an odd k (padded to pairs with zeros), one row (a decode step's
    GEMV) and columns that are no multiple of the tile: float32 accumulation of the exact bf16
    products (checked before the output's bf16 rounding: the matmul returns float32)."""
    import ml_dtypes
    from tir_schedules import bf16_dot

    torch.manual_seed(k)
    a, w = torch.randn(m, k).to(torch.bfloat16), torch.randn(k, n).to(torch.bfloat16)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, k), "bfloat16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            weight = relax.const(tvm.runtime.tensor(w.float().numpy().astype(ml_dtypes.bfloat16)))
            out = bb.emit_output(bb.emit(relax.op.matmul(x, weight, out_dtype="float32")))
        bb.emit_func_output(out)
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "mtriple": "x86_64-linux-gnu"})
    ex = sw.compile(bb.get(), target)
    assert "vdpbf16ps" in ex.mod.imports[0].inspect_source("asm")
    if not bf16_dot.available(host_target()):
        return                                        # (compiled and read; this CPU cannot run it)
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(a.float().numpy().astype(ml_dtypes.bfloat16)))
    want = a.double().numpy() @ w.double().numpy()
    assert np.abs(got.numpy() - want).max() <= 1e-5 * np.abs(want).max()


# --- AMX-BF16 (Sapphire / Emerald / Granite Rapids): 32 x 32 tiles of tdpbf16ps ------------------

SAPPHIRE = {"kind": "llvm", "mcpu": "sapphirerapids", "mtriple": "x86_64-linux-gnu"}


def _bf16_dense(rows, k, n, epilogue=False, seed=0):
    """``x @ W`` (+ b, SiLU with ``epilogue``) for a bf16 ``x`` of ``rows x k`` (``rows`` an int or
    a ``tirx.Var``) and a bf16 weight, float32 out; the module and its float64 reference."""
    import ml_dtypes

    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal(n).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, k), "bfloat16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.const(tvm.runtime.tensor(w)), out_dtype="float32"))
            if epilogue:
                y = bb.emit(relax.op.nn.silu(relax.op.add(y, relax.const(b))))
            out = bb.emit_output(y)
        bb.emit_func_output(out)

    def reference(a):
        y = a.astype("float64") @ w.astype("float64")
        return (y + b) / (1 + np.exp(-(y + b))) if epilogue else y

    return bb.get(), reference


@pytest.mark.parametrize("rows", [64, 33, tirx.Var("L", "int64"), 1])
def test_amx_tiles_in_the_assembly_for_prefill_rows(rows):
    """Compiled for Sapphire Rapids, a bf16 matmul with 32 rows or more, or symbolic rows
    (prefill), multiplies with AMX (``tdpbf16ps`` on tiles loaded by ``tileloadd``, the tile
    configuration loaded by ``ldtilecfg``); one row (a decode step's GEMV) keeps ``vdpbf16ps``."""
    from tir_schedules import amx_bf16

    target = tvm.target.Target(SAPPHIRE)
    assert amx_bf16.available(target) and not amx_bf16.available(tvm.target.Target({"kind": "llvm", "mcpu": "znver4"}))
    mod, _ = _bf16_dense(rows, 100, 70, epilogue=True)
    asm = sw.compile(mod, target).mod.imports[0].inspect_source("asm")
    amx = not isinstance(rows, int) or rows >= amx_bf16.ROWS
    for instruction in ("tdpbf16ps", "tileloadd", "tilestored", "ldtilecfg"):
        assert (instruction in asm) == amx, instruction
    assert ("vdpbf16ps" in asm) != amx


@pytest.mark.parametrize("rows,k,n", [(33, 100, 70), (65, 768, 64), (tirx.Var("L", "int64"), 70, 96)])
def test_amx_kernel_emulated_matches_float64(emulated_amx, rows, k, n):  # pylint: disable=unused-argument
    """The AMX kernel's addresses, strides, tile numbering and k-pair layout, run through the
    emulated tile file on this CPU (it needs AVX512-BF16 for the rest of the path): float32
    accumulation of exact bf16 products equals float64, for ragged rows, columns and depths
    (padded to the 32 x 32 x 32 tile), symbolic rows, and a bias + SiLU epilogue."""
    import ml_dtypes
    from tir_schedules import bf16_dot

    mod, reference = _bf16_dense(rows, k, n, epilogue=not isinstance(rows, int) or rows == 33)
    target = host_target()
    with target:
        fused = tvm.transform.Sequential(dense_cpu.tunable_passes(target) + dense_cpu.schedule_passes())(mod)
    scripts = [f.script() for _, f in fused.functions_items() if isinstance(f, tirx.PrimFunc)]
    assert any("T.alloc_local((T.int64(4), T.int64(16), T.int64(32)), \"bfloat16\")" in s for s in scripts)   # (AMX taken)
    if not bf16_dot.available(target):
        return                                        # (scheduled; this CPU cannot run the rest)
    vm = relax.VirtualMachine(sw.compile(mod, target), tvm.cpu())
    rng = np.random.default_rng(7)
    for length in ([rows] if isinstance(rows, int) else [1, 32, 45, 130]):
        a = rng.standard_normal((length, k)).astype(ml_dtypes.bfloat16)
        got, want = vm["main"](tvm.runtime.tensor(a)).numpy(), reference(a)
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), length


def test_amx_runs_natively_where_the_host_has_it():
    """On an AMX host (Sapphire Rapids and later), the AMX kernel itself: the permission
    requested by the pipeline, the tiles run, float64 met.  Elsewhere it was compiled and read
    above, and run emulated."""
    import ml_dtypes
    from tir_schedules import amx_bf16

    if not amx_bf16.host_has_amx():
        return                                        # (this CPU has no AMX: nothing to run)
    mod, reference = _bf16_dense(tirx.Var("L", "int64"), 256, 96, epilogue=True)
    ex = sw.compile(mod, host_target())
    assert "tdpbf16ps" in ex.mod.imports[0].inspect_source("asm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    rng = np.random.default_rng(8)
    for length in (1, 40, 97):
        a = rng.standard_normal((length, 256)).astype(ml_dtypes.bfloat16)
        got, want = vm["main"](tvm.runtime.tensor(a)).numpy(), reference(a)
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), length


def test_amx_permission_is_granted_or_refused_clearly():
    """``request_permission`` succeeds on an AMX host and, elsewhere, raises an error that
    says what was refused and how to compile without AMX (never a SIGILL later)."""
    from tir_schedules import amx_bf16

    if amx_bf16.host_has_amx():
        amx_bf16.request_permission()
        return
    with pytest.raises(RuntimeError, match=r"AMX.*arch_prctl.*errno \d+.*-amx-bf16"):
        amx_bf16.request_permission()


@pytest.mark.parametrize("m", [1, 37])
def test_int8_weight_is_packed_as_int8_and_widened_in_registers(m):
    """A float32 x int8 matmul (``out_dtype="float32"``: a weight-only quantized Linear before
    its per-channel scale) is the dense rule's: its weight packed once, still int8 (a quarter of
    the bytes a GEMV streams), widened in the tile; exact against float64."""
    rng = np.random.default_rng(m)
    k, n = 100, 70
    w = rng.integers(-127, 128, (k, n)).astype("int8")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, k), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.matmul(x, relax.const(w), out_dtype="float32")))
        bb.emit_func_output(out)
    mod = bb.get()
    target = host_target()
    with target:
        fused = tvm.transform.Sequential(dense_cpu.tunable_passes(target) + dense_cpu.schedule_passes())(mod)
    (dense,) = [f for g, f in fused.functions_items() if g.name_hint.endswith("_prepacked")]
    assert dense.attrs["scanweaver.rule"] == "DenseCPU"
    packed = [p for p in dense.params if len(p.ty.shape) == 3]
    assert len(packed) == 1 and str(packed[0].ty.dtype) == "int8"
    a = rng.standard_normal((m, k)).astype("float32")
    got = relax.VirtualMachine(sw.compile(mod, target), tvm.cpu())["main"](tvm.runtime.tensor(a)).numpy()
    want = a.astype("float64") @ w.astype("float64")
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
