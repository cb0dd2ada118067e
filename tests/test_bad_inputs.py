"""Bad inputs at every door (spec API, ONNX and PyTorch importers, compile, CLI): one clear
error naming the operand/node/file and the reason, or (where TVM can do it) the model left
as it was and still correct; never a crash deep in TVM, a wrong result or a half-written file."""
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import tvm
from onnx import TensorProto, helper
from tvm import relax

import scanweaver_tvm as sw
from scanweaver_tvm import cli, reference
from scanweaver_tvm.onnx_frontend import UnsupportedRecurrence
from scanweaver_core.spec import AffineScanSpec, SelectiveScanSpec

CUDA = {"kind": "cuda", "arch": "sm_90"}


# -- small ONNX models: Scan over X (a) and Y (b) with state h -----------------------------

def _vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def scan_model(body_ops=None, state=(3,), a_shape=(7, 3), b_shape=(7, 3), dtype=TensorProto.FLOAT):
    """``h = body(h, a_t, b_t)`` (default ``h*a_t + b_t``), every state collected."""
    body_ops = body_ops or [("Mul", ["h", "a_t"], "ah"), ("Add", ["ah", "b_t"], "hn")]
    nodes = [helper.make_node(op, ins, [out], name=f"step_{out}") for op, ins, out in body_ops]
    nodes.append(helper.make_node("Identity", ["hn"], ["y_t"], name="collect"))
    body = helper.make_graph(nodes, "body", [_vi("h", list(state), dtype), _vi("a_t", list(a_shape[1:]), dtype),
                                             _vi("b_t", list(b_shape[1:]), dtype)],
                             [_vi("hn", list(state), dtype), _vi("y_t", list(state), dtype)])
    scan = helper.make_node("Scan", ["h0", "X", "Y"], ["h_last", "states"], name="rnn_scan", body=body,
                            num_scan_inputs=2)
    length = a_shape[0]
    graph = helper.make_graph([scan], "g", [_vi("h0", list(state), dtype), _vi("X", list(a_shape), dtype),
                                            _vi("Y", list(b_shape), dtype)],
                              [_vi("h_last", list(state), dtype), _vi("states", [length, *state], dtype)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def run_cli(capsys, *argv):
    code = cli.main([str(a) for a in argv] + ["-q"])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, *fragments):
    assert code == 2 and "Traceback" not in err, err
    assert len(err.splitlines()) == 1 and err.startswith("scanweaver-tvm: error: "), err
    for f in fragments:
        assert f in err, err


def expect(exc, call, *fragments):
    with pytest.raises(exc) as info:
        call()
    for f in fragments:
        assert f in str(info.value), str(info.value)
    return info.value


# -- files -------------------------------------------------------------------------------

@pytest.fixture
def bad_files(tmp_path):
    good = scan_model().SerializeToString()
    corrupt, truncated = tmp_path / "corrupt.onnx", tmp_path / "truncated.onnx"
    corrupt.write_bytes(b"\x08\x07\xff\xff\xff not protobuf" + bytes(range(256)))
    truncated.write_bytes(good[: len(good) * 2 // 3])
    return corrupt, truncated


def test_corrupt_and_truncated_onnx_api(bad_files):
    corrupt, truncated = bad_files
    expect(UnsupportedRecurrence, lambda: sw.from_onnx(str(corrupt)), str(corrupt), "corrupt or truncated")
    expect(UnsupportedRecurrence, lambda: sw.from_onnx(truncated), str(truncated), "truncated")


@pytest.mark.parametrize("command", ["report", "compile"])
def test_corrupt_and_truncated_onnx_cli(capsys, tmp_path, bad_files, command):
    for path in bad_files:
        out = tmp_path / "model.so"
        extra = ["-o", out] if command == "compile" else []
        code, stdout, err = run_cli(capsys, command, path, *extra)
        assert_one_line_error(code, err, f"cannot import {path}", "ONNX model")
        assert stdout == "" and not out.exists()


def test_missing_model_paths_cli(capsys, tmp_path):
    out = tmp_path / "model.so"
    for model, fragment in [(tmp_path / "nope.onnx", "model file not found"),
                            (f"{tmp_path}/nope.py:make", "model file not found"),
                            (tmp_path, "is a directory")]:
        code, _, err = run_cli(capsys, "compile", model, "-o", out)
        assert_one_line_error(code, err, fragment, str(tmp_path))
    assert list(tmp_path.iterdir()) == []


# -- ONNX Scan with a non-affine body ----------------------------------------------------------

def test_non_affine_scan_is_refused_naming_node_and_op(capsys, tmp_path):
    """Decision: refuse, naming the Scan node and the op.  TVM has no Scan converter, so the
    alternative would be unrolling the body L times: an O(L)-binding graph that compiles for
    minutes at L = 1024, without the user asking for it.  onnxruntime runs the model, so the
    refusal is about ScanWeaver's support, not a broken model."""
    ort = pytest.importorskip("onnxruntime")
    tanh_rnn = scan_model([("Mul", ["h", "a_t"], "ah"), ("Add", ["ah", "b_t"], "pre"),
                           ("Tanh", ["pre"], "hn")])
    rng = np.random.default_rng()
    feeds = {"h0": rng.standard_normal(3), "X": rng.uniform(-1, 1, (7, 3)), "Y": rng.standard_normal((7, 3))}
    feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
    sess = ort.InferenceSession(tanh_rnn.SerializeToString(), providers=["CPUExecutionProvider"])
    h_last, _ = sess.run(None, feeds)
    h = feeds["h0"].astype(np.float64)
    for t in range(7):
        h = np.tanh(feeds["X"][t] * h + feeds["Y"][t])
    np.testing.assert_allclose(h_last, h, rtol=1e-5, atol=1e-6)   # a valid model
    err = expect(UnsupportedRecurrence, lambda: sw.from_onnx(tanh_rnn),
                 "Scan node 'rnn_scan'", "'step_hn' (Tanh)", "not affine in state 0")
    assert "Error converting operator" not in capsys.readouterr().out   # TVM's dump dropped
    assert err.__cause__ is None
    path = tmp_path / "tanh_rnn.onnx"
    onnx.save(tanh_rnn, str(path))
    code, _, cli_err = run_cli(capsys, "report", path)
    assert_one_line_error(code, cli_err, "Scan node 'rnn_scan'", "Tanh")

    # the affine twin of the same model converts and matches onnxruntime
    affine = scan_model()
    want = ort.InferenceSession(affine.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    vm = relax.VirtualMachine(sw.compile(sw.from_onnx(affine), "llvm"), tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(feeds[k]) for k in ("h0", "X", "Y")])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-5)


# -- dtypes --------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.int32, np.complex64, np.float64])
def test_unsupported_dtypes_spec_api(dtype):
    a, b = np.ones((2, 8), dtype), np.ones((2, 8), dtype)
    expect(ValueError, lambda: AffineScanSpec.for_arrays(a, b), "dtype:", np.dtype(dtype).name)
    x = [np.ones(s, dtype) for s in [(1, 2, 8), (1, 2, 8), (2, 4), (1, 4, 8), (1, 4, 8)]]
    expect(ValueError, lambda: SelectiveScanSpec.for_arrays(*x), "dtype")


def test_onnx_integer_and_complex():
    expect(UnsupportedRecurrence, lambda: sw.from_onnx(scan_model(dtype=TensorProto.INT32)),
           "Scan node 'rnn_scan'", "int32 is not supported")
    expect(UnsupportedRecurrence, lambda: sw.from_onnx(scan_model(dtype=TensorProto.COMPLEX64)),
           "input 'h0'", "complex64")


class Decay(torch.nn.Module):
    """h_t = g_t * h_{t-1} + x_t (unrolled by torch.export), all states stacked."""

    def forward(self, x, g):
        h, outs = torch.zeros_like(x[:, 0]), []
        for t in range(x.shape[1]):
            h = g[:, t] * h + x[:, t]
            outs.append(h)
        return torch.stack(outs, 1)


def test_torch_integer_recurrence_is_left_as_it_was_and_stays_exact():
    """TVM compiles integer steps itself: the pass leaves them (saying why) instead of failing."""
    x = torch.randint(-50, 50, (2, 9, 3), dtype=torch.int32)
    g = torch.randint(-2, 3, (2, 9, 3), dtype=torch.int32)
    mod = sw.from_torch(Decay(), (x, g))
    (rec,) = sw.find_recurrences(mod, include_rejected=True)
    assert rec.rejected and "dtype int32" in rec.reason and "left as it was" in rec.reason
    vm = relax.VirtualMachine(sw.compile(mod, "llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x.numpy()), tvm.runtime.tensor(g.numpy()))
    np.testing.assert_array_equal(got[0].numpy(), Decay()(x, g).numpy())


def test_torch_complex_names_the_input():
    x = torch.randn(2, 5, 3, dtype=torch.complex64)
    expect(ValueError, lambda: sw.from_torch(Decay(), (x, x)), "example_args[0] (x)", "complex64")


# -- L = 0, symbolic L, mismatched shapes -------------------------------------------------------

def test_zero_length():
    expect(ValueError, lambda: AffineScanSpec.create((4, 0)), "b:", "L >= 1")
    expect(ValueError, lambda: reference.affine_scan(np.ones((4, 0)), np.ones((4, 0))), "L >= 1")
    u = np.ones((1, 2, 0), np.float32)
    expect(ValueError, lambda: SelectiveScanSpec.for_arrays(u, u, np.ones((2, 4), np.float32),
                                                            np.ones((1, 4, 0), np.float32),
                                                            np.ones((1, 4, 0), np.float32)), "u:", "L is 0")
    expect(UnsupportedRecurrence, lambda: sw.from_onnx(scan_model(a_shape=(0, 3), b_shape=(0, 3))),
           "input 'X'", "size 0", "L = 0")


def test_symbolic_length_where_unsupported():
    expect(ValueError, lambda: SelectiveScanSpec(1, 2, None, 4), "length")
    dynamic = scan_model(a_shape=(None, 3), b_shape=(None, 3))      # unknown, unnamed: untraceable
    expect(UnsupportedRecurrence, lambda: sw.from_onnx(dynamic), "Scan node 'rnn_scan'", "static shape")


def test_mismatched_shapes():
    expect(ValueError, lambda: AffineScanSpec.for_arrays(np.ones((3, 8), np.float32), np.ones((2, 8), np.float32)),
           "a:", "does not broadcast", "dimension 0: 3 vs 2")
    expect(ValueError, lambda: AffineScanSpec.for_arrays(np.ones((2, 8), np.float32), np.ones((2, 8), np.float32),
                                                         h0=np.ones(3, np.float32)), "h0:", "state shape")
    expect(UnsupportedRecurrence, lambda: sw.from_onnx(scan_model(a_shape=(7, 4), b_shape=(7, 4))),
           "Scan node 'rnn_scan'", "(Mul): TVM cannot convert it: relax.multiply: the first input shape",
           "not broadcastable")
    expect(UnsupportedRecurrence, lambda: sw.from_onnx(scan_model(b_shape=(6, 3))),
           "Scan node 'rnn_scan'", "differ in length")


def test_mismatched_lengths_torch_scan_op():
    from torch._higher_order_ops.scan import scan

    def step(h, xs):
        h2 = xs[0] * h + xs[1]
        return h2, h2.clone()

    class Hop(torch.nn.Module):
        def forward(self, h0, a, b):
            return scan(step, h0, (a, b))[1]

    expect(ValueError, lambda: sw.from_torch(Hop(), (torch.zeros(3), torch.rand(5, 3), torch.rand(4, 3))),
           "scan node", "differ in length")


# -- CUDA without nvcc ---------------------------------------------------------------------------

@pytest.fixture
def no_nvcc(monkeypatch):
    """PATH without the folders that hold nvcc (the C compiler for export_library stays)."""
    path = [d for d in os.environ["PATH"].split(os.pathsep) if d and not os.path.exists(os.path.join(d, "nvcc"))]
    monkeypatch.setenv("PATH", os.pathsep.join(path))
    assert shutil.which("nvcc") is None


def test_cuda_without_nvcc(no_nvcc, capsys, tmp_path):
    """Decision: building for CUDA needs no nvcc (the library keeps CUDA C, compiled when it is
    loaded on the GPU machine), so ``sw.compile`` works; checking it does, and says so."""
    from tir_schedules import cuda_check

    ex = sw.compile(sw.from_onnx(scan_model()), CUDA)
    (source,) = cuda_check.module_cuda_sources(ex.mod)
    assert "__global__" in source and "scanweaver_scan" in source
    expect(RuntimeError, lambda: cuda_check.ptx(source), "nvcc not found on PATH")
    path = tmp_path / "scan.onnx"
    onnx.save(scan_model(), str(path))
    out = tmp_path / "scan_cuda.so"
    code, _, err = run_cli(capsys, "compile", path, "--target", "cuda", "-o", out)
    assert_one_line_error(code, err, "nvcc is not on PATH", "--no-nvcc-check")
    assert not out.exists()
    code, stdout, err = run_cli(capsys, "compile", path, "--target", "cuda", "--no-nvcc-check", "-o", out)
    assert code == 0, err
    assert "NOT checked" in stdout and b"__global__" in out.read_bytes()


# -- output written atomically -------------------------------------------------------------------

def test_failed_link_leaves_the_old_output_and_no_temporary(capsys, tmp_path, monkeypatch):
    """A real failing compiler driver that writes half a file, then exits 1."""
    driver = tmp_path / "bin" / "broken-cc"
    driver.parent.mkdir()
    driver.write_text('#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = -o ] && printf half > "$2"; shift; done\nexit 1\n')
    driver.chmod(0o755)
    monkeypatch.setenv("CXX", str(driver))
    model = tmp_path / "scan.onnx"
    onnx.save(scan_model(), str(model))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "model.so"
    out.write_bytes(b"the previous library")
    code, stdout, err = run_cli(capsys, "compile", model, "-o", out)
    assert_one_line_error(code, err, f"cannot write {out}")
    assert stdout == "" and out.read_bytes() == b"the previous library"
    assert [p.name for p in out_dir.iterdir()] == ["model.so"]


# -- MLIR tools missing ----------------------------------------------------------------------------

def test_missing_mlir_opt(monkeypatch, tmp_path, capsys):
    """``SCANWEAVER_MLIR_BIN`` pointing at a folder without the tools (as when they are not
    installed): the bridge, ``sw.compile(realization="mlir")`` and the CLI all name mlir-opt."""
    mlir_bridge = pytest.importorskip("mlir_bridge")
    empty = tmp_path / "no-mlir"
    empty.mkdir()
    monkeypatch.setenv("SCANWEAVER_MLIR_BIN", str(empty))
    spec = AffineScanSpec.create((2, 16))
    expect(mlir_bridge.MlirToolsMissing, lambda: mlir_bridge.cpu_llvm_ir(spec), "mlir-opt", str(empty), "install")
    a = b = np.ones((2, 16), np.float32)
    expect(mlir_bridge.MlirToolsMissing, lambda: mlir_bridge.run_cpu(spec, a, b), "mlir-opt")
    mod = sw.from_onnx(scan_model())
    expect(RuntimeError, lambda: sw.compile(mod, "llvm", realization="mlir"), "mlir-opt", "install")
    path = tmp_path / "scan.onnx"
    onnx.save(scan_model(), str(path))
    out = tmp_path / "m.so"
    code, _, err = run_cli(capsys, "compile", path, "--realization", "mlir", "-o", out)
    assert_one_line_error(code, err, "mlir-opt")
    assert not out.exists()


class _ValueDependentLength(torch.nn.Module):
    def forward(self, x):
        n = int((x > 0).sum())            # a length read from values: torch.export cannot trace it
        return x[:, :n].sum(1) if n > 2 else x


class _NonzeroIndices(torch.nn.Module):
    def forward(self, x):
        return x.new_zeros(torch.nonzero(x > 0).shape[0]) + 1


def test_a_model_torch_export_cannot_trace_is_named_at_its_line():
    """torch.export's own failure (a data-dependent guard, as some hub models' routers raise)
    reaches the user as ``ImportRefused`` naming the model, torch's reason and the model's line."""
    from scanweaver_tvm.api import ImportRefused

    with pytest.raises(ImportRefused, match=r"_ValueDependentLength: torch.export cannot trace its forward "
                                            r"\(GuardOnDataDependentSymNode.*test_bad_inputs.py:\d+ `n = int"):
        sw.from_torch(_ValueDependentLength(), (torch.randn(2, 8),))


def test_an_op_tvms_frontend_cannot_convert_is_named():
    from scanweaver_tvm.api import ImportRefused

    with pytest.raises(ImportRefused, match=r"_NonzeroIndices: TVM 0.27's PyTorch frontend has no converter for "
                                            r"\['nonzero.default'\]"):
        sw.from_torch(_NonzeroIndices(), (torch.randn(2, 8),))
