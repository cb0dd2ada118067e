"""The rewrite pinned as IR, as TVM's own pass tests are: a ``Before`` module in TVMScript, the
pass applied, ``tvm.ir.assert_structural_equal`` against ``Expected``.  Fast, and any change
in what the pass emits shows here first."""
import tvm
from tvm.script import ir as I
from tvm.script import relax as R

from relax_pass.fuse import FuseAffineRecurrences

SCAN = "scanweaver.affine_scan"


def test_an_unrolled_chain_stacked_by_concat_becomes_one_scan():
    """``h_t = a_t h_(t-1) + x_t`` from ``h``, three steps, ``concat`` of ``expand_dims``: the
    scan reads ``a`` and ``x`` whole and its states are the stack."""
    @I.ir_module
    class Before:
        @R.function
        def main(a: R.Tensor((2, 3), "float32"), x: R.Tensor((2, 3), "float32"),
                 h: R.Tensor((2,), "float32")) -> R.Tensor((2, 3), "float32"):
            with R.dataflow():
                a0 = R.take(a, R.const(0, "int64"), axis=1)
                x0 = R.take(x, R.const(0, "int64"), axis=1)
                h0 = R.add(R.multiply(a0, h), x0)
                a1 = R.take(a, R.const(1, "int64"), axis=1)
                x1 = R.take(x, R.const(1, "int64"), axis=1)
                h1 = R.add(R.multiply(a1, h0), x1)
                a2 = R.take(a, R.const(2, "int64"), axis=1)
                x2 = R.take(x, R.const(2, "int64"), axis=1)
                h2 = R.add(R.multiply(a2, h1), x2)
                s = R.concat((R.expand_dims(h0, 1), R.expand_dims(h1, 1), R.expand_dims(h2, 1)), axis=1)
                R.output(s)
            return s

    @I.ir_module
    class Expected:
        @R.function
        def main(a: R.Tensor((2, 3), "float32"), x: R.Tensor((2, 3), "float32"),
                 h: R.Tensor((2,), "float32")) -> R.Tensor((2, 3), "float32"):
            with R.dataflow():
                lv = R.call_pure_packed(
                    SCAN, a, x, h,
                    R.str('{"a_shape": [2, 3], "axis": 1, "dtype": "float32", "has_h0": true, '
                          '"outputs": ["states"], "reverse": false, "shape": [2, 3]}'),
                    ty_args=(R.Tensor((2, 3), "float32"),))
                gv = lv
                R.output(gv)
            return gv

    tvm.ir.assert_structural_equal(FuseAffineRecurrences()(Before), Expected)


def test_a_chain_from_its_first_input_stacked_by_stack():
    """``h_0 = x_0`` then two steps, the states gathered by ``R.stack``: ``h_0 = b_0`` is the
    first step from a zero state, so the scan runs all three and its states are the stack."""
    @I.ir_module
    class Before:
        @R.function
        def main(a: R.Tensor((2, 3), "float32"), x: R.Tensor((2, 3), "float32")) -> R.Tensor((2, 3), "float32"):
            with R.dataflow():
                h0 = R.take(x, R.const(0, "int64"), axis=1)
                a1 = R.take(a, R.const(1, "int64"), axis=1)
                x1 = R.take(x, R.const(1, "int64"), axis=1)
                h1 = R.add(R.multiply(a1, h0), x1)
                a2 = R.take(a, R.const(2, "int64"), axis=1)
                x2 = R.take(x, R.const(2, "int64"), axis=1)
                h2 = R.add(R.multiply(a2, h1), x2)
                s = R.stack((h0, h1, h2), axis=1)
                R.output(s)
            return s

    @I.ir_module
    class Expected:
        @R.function
        def main(a: R.Tensor((2, 3), "float32"), x: R.Tensor((2, 3), "float32")) -> R.Tensor((2, 3), "float32"):
            with R.dataflow():
                lv = R.call_pure_packed(
                    SCAN, a, x,
                    R.str('{"a_shape": [2, 3], "axis": 1, "dtype": "float32", "has_h0": false, '
                          '"outputs": ["states"], "reverse": false, "shape": [2, 3]}'),
                    ty_args=(R.Tensor((2, 3), "float32"),))
                gv = lv
                R.output(gv)
            return gv

    tvm.ir.assert_structural_equal(FuseAffineRecurrences()(Before), Expected)
