"""ONNX import robustness (issue "Right on code it has never seen", case 11): unnamed nodes are
named in errors, a model TVM's FoldConstant would break still imports and compiles, and a failed
shape inference is a warning, not silence."""
import warnings

import numpy as np
import onnxruntime as ort
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import relax

import scanweaver_tvm as sw

from test_onnx_scan_loop import model, node, scan_model, vi


def test_unnamed_scan_is_named_by_index_and_output():
    m = scan_model([node("Tanh", ["h"], ["t"]), node("Add", ["t", "x0_t"], ["hn"])], [3], [[7, 3]])
    for n in m.graph.node:
        n.name = ""
    with pytest.raises(ValueError) as info:
        sw.from_onnx(m)
    assert "Scan node '#0 (output " in str(info.value) and "Scan node ''" not in str(info.value)


def test_runtime_slice_imports_and_compiles_like_tvm_does():
    """A Slice bounded at run time: TVM 0.27's FoldConstant left a call to a removed
    ``shape_func`` (InternalError at compile); the import must give a module that compiles."""
    m = model([node("Slice", ["x", "starts", "ends"], ["y"]), node("Relu", ["y"], ["z"])],
              [vi("x", [8]), vi("starts", [1], TensorProto.INT64), vi("ends", [1], TensorProto.INT64)],
              [vi("z", None)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = sw.from_onnx(m)
    ex = sw.compile(mod, "llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    x = np.random.default_rng(0).standard_normal(8).astype("float32")
    starts, ends = np.array([2], "int64"), np.array([6], "int64")
    got = vm["main"](*[tvm.runtime.tensor(v) for v in (x, starts, ends)]).numpy()
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "starts": starts, "ends": ends})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_failed_shape_inference_is_a_warning(monkeypatch):
    import onnx

    def broken(*_args, **_kwargs):
        raise RuntimeError("inference exploded")

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", broken)
    m = model([node("Relu", ["x"], ["y"])], [vi("x", [4])], [vi("y", [4])])
    with pytest.warns(UserWarning, match="shape inference failed.*inference exploded"):
        sw.from_onnx(m)
