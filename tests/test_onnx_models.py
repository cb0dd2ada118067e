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


def export(model, args):
    f = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # legacy exporter deprecation, tracer warnings
        torch.onnx.export(model, tuple(args), f, dynamo=False, opset_version=17)
    return onnx.load_from_string(f.getvalue())


def run(mod, args):
    vm = relax.VirtualMachine(sw.compile(mod, "llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a.numpy()) for a in args])
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


def expect(model, args):
    with torch.no_grad():
        out = model(*args)
    return [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]


def assert_matches(got, want, rtol=1e-4):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        err = np.abs(g - w).max() / max(1.0, np.abs(w).max())
        assert err <= rtol, f"relative error {err:.2e}"


FORMS = {models.ema: "affine", models.linear_rnn: "affine", models.mamba_block: "selective"}


@pytest.mark.parametrize("length", [1, 7, 64])
@pytest.mark.parametrize("factory", list(FORMS), ids=lambda f: f.__name__)
def test_exported_models_match_pytorch(factory, length):
    model, args = factory(length=length)
    mod = sw.from_onnx(export(model, args))
    found = sw.find_recurrences(mod)
    if length == 1:
        assert found == []
    else:
        assert len(found) == 1, sw.find_recurrences(mod, include_rejected=True)
        assert found[0].form == FORMS[factory]
        # Mamba: the first step, from ONNX's constant zeros, belongs to the selective scan
        assert found[0].length == (length if FORMS[factory] == "selective" else length - 1)
        fused = sw.FuseAffineRecurrences()(mod).script(show_meta=False)
        assert ('"scanweaver.selective_scan"' in fused) == (FORMS[factory] == "selective")
    assert_matches(run(mod, args), expect(model, args))


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
