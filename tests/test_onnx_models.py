"""Models exported with ``torch.onnx.export(..., dynamo=False, opset_version=17)`` (the TorchScript
exporter: a Python loop is unrolled, reshape/slice targets come from ``Shape`` ops), imported
with ``sw.from_onnx``, their recurrences found, compiled for LLVM and compared with PyTorch."""
import io
import warnings

import numpy as np
import onnx
import pytest
import torch
import tvm
from onnx import TensorProto, helper
from tvm import relax

import scanweaver_tvm as sw
from scanweaver_tvm import models
from scanweaver_tvm.onnx_frontend import _fold_static_shapes

from harness import assert_outputs_match, run_model, torch_outputs


def export(model, args):
    f = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # legacy exporter deprecation, tracer warnings
        torch.onnx.export(model, tuple(args), f, dynamo=False, opset_version=17)
    return onnx.load_from_string(f.getvalue())


FORMS = {models.ema: "affine", models.linear_rnn: "affine", models.mamba_block: "selective"}


@pytest.mark.parametrize("length", [1, 7, 64, 256])
@pytest.mark.parametrize("factory", list(FORMS), ids=lambda f: f.__name__)
def test_exported_models_match_pytorch(factory, length):
    model, args = factory(length=length)
    mod = sw.from_onnx(export(model, args))
    found = sw.find_recurrences(mod)
    if length == 1:
        assert found == []
    else:
        assert len(found) == 1, sw.find_recurrences(mod, include_rejected=True)
        form = FORMS[factory]
        assert (found[0].form, found[0].length) == (form, length)    # ONNX's zero start is a step
        fused = sw.FuseAffineRecurrences()(mod).script(show_meta=False)
        assert fused.count(f'"scanweaver.{form}_scan"') == 1
    assert_outputs_match(run_model(mod, args), torch_outputs(model, args))


def test_static_shape_and_size_become_constants():
    """Shape (with start/end) and Size of statically shaped tensors fold; a dynamic one stays."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])
    outs = [helper.make_tensor_value_info(n, TensorProto.INT64, None) for n in ("s", "t", "z", "d")]
    graph = helper.make_graph([
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Shape", ["x"], ["t"], start=1, end=-1),
        helper.make_node("Size", ["x"], ["z"]),
        helper.make_node("Shape", ["y"], ["d"])], "g", [x, y], outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    folded = _fold_static_shapes(model)
    values = {n.output[0]: onnx.numpy_helper.to_array(n.attribute[0].t)
              for n in folded.graph.node if n.op_type == "Constant"}
    assert set(values) == {"s", "t", "z"}
    assert values["s"].tolist() == [2, 3, 4] and values["t"].tolist() == [3] and values["z"] == 24
    assert [n.op_type for n in folded.graph.node if n.output[0] == "d"] == ["Shape"]
    assert [n.op_type for n in model.graph.node] == ["Shape", "Shape", "Size", "Shape"]  # not mutated


def test_gather_at_constant_indices():
    """Gather at constant indices (negative, and a 2-D index tensor) imports as a plain take."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 3])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "z")]
    graph = helper.make_graph([
        helper.make_node("Gather", ["x", "i"], ["y"], axis=1),
        helper.make_node("Gather", ["x", "j"], ["z"], axis=-1)], "g", [x], outs, initializer=[
        onnx.numpy_helper.from_array(np.array(-1, np.int64), "i"),
        onnx.numpy_helper.from_array(np.array([[0, -2], [2, -3]], np.int32), "j")])
    mod = sw.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    script = mod.script(show_meta=False)
    assert "shape_of" not in script and "where" not in script
    data = np.random.default_rng(0).standard_normal((2, 5, 3)).astype("float32")
    vm = relax.VirtualMachine(sw.compile(mod, "llvm"), tvm.cpu())
    y, z = (o.numpy() for o in vm["main"](tvm.runtime.tensor(data)))
    np.testing.assert_array_equal(y, data[:, -1])
    np.testing.assert_array_equal(z, np.take(data, [[0, -2], [2, -3]], axis=-1))
