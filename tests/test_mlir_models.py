"""The MLIR realization inside TVM's build flow: whole models compiled with
``realization="mlir"`` run on the CPU (the bridge's LLVM IR linked into TVM's LLVM module) and
match PyTorch; libraries round-trip through export_library/load_module; for CUDA the executable
carries the PTX as a device module, checked by ptxas (running it needs a GPU: bench/gpu/)."""
import numpy as np
import pytest
import tvm
from tvm import relax, tirx

import scanweaver_tvm as sw
import mlir_bridge
from mlir_bridge import tvm_wrap
from scanweaver_core.scan_op import make_scan
from scanweaver_tvm import models
from scanweaver_core.reference import affine_scan
from scanweaver_core.spec import AffineScanSpec
from tir_schedules import cuda_check

from harness import assert_outputs_match, run_model, torch_outputs


def _scan_funcs(mod):
    return {g.name_hint: f for g, f in mod.functions_items()
            if isinstance(f, tirx.PrimFunc) and g.name_hint.startswith("scanweaver_scan")}


@pytest.mark.parametrize("factory,kwargs", [
    (models.ema, dict(length=37)),
    (models.linear_rnn, dict(length=64)),
    (models.mamba_block, dict(length=33, batch=2)),
], ids=["ema", "linear_rnn", "mamba_block"])
def test_models_match_pytorch(factory, kwargs):
    model, args = factory(**kwargs)
    mod = sw.from_torch(model, args)
    lowered = sw.passes("llvm", realization="mlir")(mod)
    funcs = _scan_funcs(lowered)
    assert len(funcs) == 1
    func = next(iter(funcs.values()))
    assert func.attrs["scanweaver.realization"] == "mlir"     # the MLIR kernel, not a TIR one
    assert "pragma_import_llvm" in func.script()
    assert_outputs_match(run_model(mod, args, realization="mlir"), torch_outputs(model, args))


def test_onnx_scan_model_matches_onnxruntime_with_mlir():
    import io
    import warnings

    import onnx
    import torch

    model, args = models.ema(length=20)
    f = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, tuple(args), f, dynamo=False, opset_version=17)
    mod = sw.from_onnx(onnx.load_from_string(f.getvalue()))
    assert_outputs_match(run_model(mod, args, realization="mlir"), torch_outputs(model, args))


def _relax_scan(spec):
    """``main(a, b) -> scan`` with the spec's shapes."""
    a = relax.Var("a", relax.TensorType(spec.a_shape, spec.dtype))
    b = relax.Var("b", relax.TensorType(spec.shape, spec.dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [a, b]):
        out = bb.emit(make_scan(spec, [a, b]))
        bb.emit_func_output(out)
    return bb.get()


def _run(ex, *arrays):
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(x) for x in arrays])
    return out.numpy()


def test_export_library_round_trip(tmp_path):
    spec = AffineScanSpec.create((3, 50, 4), a_shape=(1, 50, 4), axis=1, reverse=True)
    rng = np.random.default_rng(1)
    a = rng.uniform(-1, 1, (1, 50, 4)).astype("float32")
    b = rng.standard_normal((3, 50, 4)).astype("float32")
    ex = sw.compile(_relax_scan(spec), "llvm", realization="mlir")
    path = str(tmp_path / "scan.so")
    ex.export_library(path)
    loaded = tvm.runtime.load_module(path)
    want = affine_scan(np.broadcast_to(a, b.shape), b, axis=1, reverse=True)
    for got in (_run(ex, a, b), _run(loaded, a, b)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_inputs_accumulate_in_float32(dtype):
    """fp16 conversions call libgcc's helpers: they must resolve inside TVM's module too."""
    import ml_dtypes

    npdt = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[dtype]
    spec = AffineScanSpec.create((3, 100), axis=1, dtype=dtype)
    rng = np.random.default_rng(4)
    a = rng.uniform(0.5, 1, (3, 100)).astype(npdt)
    b = rng.standard_normal((3, 100)).astype(npdt)
    got = _run(sw.compile(_relax_scan(spec), "llvm", realization="mlir"), a, b).astype(np.float64)
    want = affine_scan(a.astype(np.float64), b.astype(np.float64), axis=1)
    # one rounding of the fp32 result to the output dtype, over a few steps of accumulation
    tol = {"float16": 2e-3, "bfloat16": 1.6e-2}[dtype]
    assert np.abs(got - want).max() / np.abs(want).max() <= tol


def test_symbolic_length():
    """The PrimFunc passes a symbolic L to the entry as its trailing i64 (Relax scans have a
    static L; a symbolic one is a TIR-level feature)."""
    spec = AffineScanSpec.create((2, None), axis=1)
    lib = tvm_wrap.build_cpu(spec)
    rng = np.random.default_rng(2)
    for n in (1, 3, 1025):
        a = rng.uniform(0.5, 1, (2, n)).astype("float32")
        b = rng.standard_normal((2, n)).astype("float32")
        out = tvm.runtime.tensor(np.full((2, n), np.nan, "float32"))
        lib["scanweaver_scan"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
        np.testing.assert_allclose(out.numpy(), affine_scan(a, b, axis=1), rtol=1e-4, atol=1e-5)


def _two_scans():
    spec1 = AffineScanSpec.create((2, 9), axis=1)
    spec2 = AffineScanSpec.create((2, 9), axis=1, reverse=True)
    a = relax.Var("a", relax.TensorType((2, 9), "float32"))
    b = relax.Var("b", relax.TensorType((2, 9), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [a, b]):
        x = bb.emit(make_scan(spec1, [a, b]))
        y = bb.emit(make_scan(spec2, [a, x]))
        bb.emit_func_output(y)
    return bb.get()


def test_two_scans_link_into_one_module():
    """Two different scans: two MLIR kernels, their private symbols must not clash."""
    ex = sw.compile(_two_scans(), "llvm", realization="mlir")
    rng = np.random.default_rng(3)
    av = rng.uniform(0.5, 1, (2, 9)).astype("float32")
    bv = rng.standard_normal((2, 9)).astype("float32")
    want = affine_scan(av, affine_scan(av, bv, axis=1), axis=1, reverse=True)
    np.testing.assert_allclose(_run(ex, av, bv), want, rtol=1e-4, atol=1e-5)


def test_two_scans_on_cuda_launch_their_own_kernels():
    """Each scan's device module is imported separately: kernel names are per spec, or the
    second launch would find the first scan's kernel."""
    lowered = sw.passes(cuda_check.SM90, realization="mlir")(_two_scans())
    kernels = [str(k) for f in _scan_funcs(lowered).values() for k in f.attrs["scanweaver.kernels"]]
    assert len(kernels) == 2 and len(set(kernels)) == 2
    ptx = cuda_check.module_ptx(sw.compile(_two_scans(), cuda_check.SM90, realization="mlir").mod)
    assert sorted(k for k in kernels for text in ptx if f".entry {k}(" in text) == sorted(kernels)


@pytest.mark.parametrize("factory,kwargs", [
    (models.ema, dict(length=64)),
    (models.mamba_block, dict(length=64, batch=2)),   # batch 2: see test_models_cuda.py
], ids=["ema", "mamba_block"])
def test_cuda_executable_carries_checked_ptx(factory, kwargs, tmp_path):
    """GPU-run part still to do here (no GPU): bench/gpu/run_gpu_check.py launches it."""
    model, args = factory(**kwargs)
    mod = sw.from_torch(model, args)
    ex = sw.compile(mod, cuda_check.SM90, realization="mlir")
    ptx = cuda_check.module_ptx(ex.mod)
    assert len(ptx) == 1
    host = _scan_funcs(sw.passes(cuda_check.SM90, realization="mlir")(mod))
    kernels = [str(k) for f in host.values() for k in f.attrs["scanweaver.kernels"]]
    for name in kernels:                                  # every launched kernel is in the PTX
        assert f".entry {name}(" in ptx[0]
    report = cuda_check.ptxas(ptx[0])
    assert report.spill_stores == 0 and report.spill_loads == 0, report.text
    assert report.shared_bytes <= 48 * 1024, report.text
    path = tmp_path / "model_cuda.so"
    ex.export_library(str(path))
    blob = path.read_bytes()
    assert all(name.encode() in blob for name in kernels)  # the PTX travels in the library


def test_cuda_hooks_answer_only_the_building_thread(monkeypatch):
    """TVM's CUDA compile hooks are process-global.  While our build has them swapped, another
    thread asking them gets its own hook's answer, never our PTX; two of our builds in a row
    each carry their own PTX; afterwards the user's hook is back, also after a failing build."""
    import threading

    import tvm_ffi
    art = mlir_bridge.cuda_ptx(AffineScanSpec.create((2, 64), axis=1), arch="sm_90")
    second = mlir_bridge.cuda_ptx(AffineScanSpec.create((3, 64), axis=1, reverse=True), arch="sm_90")
    target = tvm.target.Target(cuda_check.SM90)
    hook, get = "tvm_callback_cuda_compile", tvm.get_global_func
    original, seen = get(hook, allow_missing=True), {}

    def build_with_a_neighbour(mod, tgt):        # another thread compiles CUDA meanwhile
        other = threading.Thread(target=lambda: seen.update(other=get(hook)("__global__ void k() {}", tgt)))
        other.start()
        other.join()
        seen["ours"] = get(hook)("", tgt)
        return get("target.build.cuda")(mod, tgt)

    def failing_build(mod, tgt):
        raise RuntimeError("build failed")

    tvm_ffi.register_global_func(hook, lambda code, tgt: b"users-own-compiler:" + code.encode(), override=True)
    try:
        for fake in (build_with_a_neighbour, failing_build):
            monkeypatch.setattr(tvm_wrap.tvm, "get_global_func",
                                lambda name, fake=fake, **kw: fake if name == "target.build.cuda" else get(name, **kw))
            try:
                tvm_wrap.device_module(art, target)
            except RuntimeError as err:
                assert fake is failing_build and "build failed" in str(err)
            monkeypatch.undo()
            assert get(hook)("x", target) == b"users-own-compiler:x"
        assert seen == {"other": b"users-own-compiler:__global__ void k() {}", "ours": art.ptx.encode()}
        for a in (art, second):
            (text,) = cuda_check.module_ptx(tvm_wrap.device_module(a, target))
            assert text.endswith(a.ptx) and a.kernels[0].name in text
    finally:
        if original is not None:
            tvm_ffi.register_global_func(hook, original, override=True)
