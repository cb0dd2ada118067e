"""``tir_schedules.widen``: the bf16 / fp16 activations of a float32-accumulating matmul are
widened before it; constants (weights) stay narrow."""
import numpy as np
import tvm
from tvm import relax
from tvm.script import relax as R

from tir_schedules.widen import WidenMatmulActivations, widen_matmul_activations


@tvm.script.ir_module
class Before:
    @R.function
    def main(x: R.Tensor((4, 8), "bfloat16"), y: R.Tensor((8, 16), "float16"), z: R.Tensor((16, 2), "bfloat16")):
        with R.dataflow():
            a = R.matmul(x, y, out_dtype="float32")
            b = R.matmul(a, z, out_dtype="float32")
            c = R.matmul(x, y, out_dtype="bfloat16")      # (a narrow result: left as it is)
            R.output(b, c)
        return (b, c)


@tvm.script.ir_module
class Expected:
    @R.function
    def main(x: R.Tensor((4, 8), "bfloat16"), y: R.Tensor((8, 16), "float16"), z: R.Tensor((16, 2), "bfloat16")):
        with R.dataflow():
            x1 = R.astype(x, "float32")
            y1 = R.astype(y, "float32")
            a = R.matmul(x1, y1, out_dtype="float32")
            z1 = R.astype(z, "float32")
            b = R.matmul(a, z1, out_dtype="float32")
            c = R.matmul(x, y, out_dtype="bfloat16")
            R.output(b, c)
        return (b, c)


def test_narrow_operands_of_a_float32_matmul_are_widened():
    after = relax.transform.Normalize()(WidenMatmulActivations(Before))
    tvm.ir.assert_structural_equal(after, Expected)


def _linear():
    """``x @ permute_dims(astype(W))``, W a constant: a Linear layer as it imports."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "bfloat16"))
    w = relax.const(np.ones((16, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            wt = bb.emit(relax.op.permute_dims(relax.op.astype(w, "bfloat16")))
            out = bb.emit_output(bb.emit(relax.op.matmul(x, wt, out_dtype="float32")))
        bb.emit_func_output(out)
    return bb.get()


def test_a_weight_stays_narrow():
    """A constant operand, or one computed from constants only (``permute_dims(W)``, as a
    Linear layer imports), is folded at compile time: widening it would double its bytes."""
    after = WidenMatmulActivations(_linear())
    calls = []
    relax.analysis.post_order_visit(after["main"], lambda e: calls.append(e) if isinstance(e, relax.Call) else None)
    matmul = next(c for c in calls if c.op.name == "relax.matmul")
    assert matmul.args[0].ty.dtype == "float32"            # the activation, widened
    assert matmul.args[1].ty.dtype == "bfloat16"           # the weight, as it was


def test_with_a_bf16_dot_product_only_products_of_activations_are_widened():
    """Where the CPU multiplies bf16 pairs (``bf16_dot``), a weight's activations stay bf16;
    ``Before``'s matmuls have no constant operand, so all of them are widened as before."""
    after = relax.transform.Normalize()(widen_matmul_activations(with_weights=False)(Before))
    tvm.ir.assert_structural_equal(after, Expected)
    linear = _linear()
    after = widen_matmul_activations(with_weights=False)(linear)
    tvm.ir.assert_structural_equal(after, linear)
