"""``relax_pass.unpad``: a prefix slice of padded elementwise arithmetic computed unpadded
(TVM's pass-test style: Before / Expected TVMScript, structurally equal)."""
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from relax_pass.prune import prune_dead_bindings
from relax_pass.unpad import unpad


def _unpadded(mod):
    return relax.transform.Normalize()(unpad(mod, prune_dead_bindings))   # (types left to infer)


def test_slice_of_padded_arithmetic_is_the_arithmetic_unpadded():
    """HF Mamba-2's tail: ``(pad(o) + D * pad(x))[:, :L]`` -> ``o + D * x``."""

    @I.ir_module
    class Before:
        @R.function
        def main(o: R.Tensor((1, 5, 2), "float32"), x: R.Tensor((1, 5, 2), "float32"),
                 d: R.Tensor((2,), "float32")) -> R.Tensor((1, 5, 2), "float32"):
            with R.dataflow():
                po = R.nn.pad(o, [0, 0, 0, 3, 0, 0])
                px = R.nn.pad(x, [0, 0, 0, 3, 0, 0])
                dx = R.multiply(d, px)
                y = R.add(po, dx)
                out = R.strided_slice(y, [1], [0], [5])
                R.output(out)
            return out

    @I.ir_module
    class Expected:
        @R.function
        def main(o: R.Tensor((1, 5, 2), "float32"), x: R.Tensor((1, 5, 2), "float32"),
                 d: R.Tensor((2,), "float32")) -> R.Tensor((1, 5, 2), "float32"):
            with R.dataflow():
                dx = R.multiply(d, x)
                out = R.add(o, dx)
                R.output(out)
            return out

    tvm.ir.assert_structural_equal(_unpadded(Before), Expected)


def test_padding_at_the_front_or_a_longer_slice_is_left_alone():
    @I.ir_module
    class Before:
        @R.function
        def main(o: R.Tensor((1, 5, 2), "float32")) -> R.Tensor((1, 5, 2), "float32"):
            with R.dataflow():
                po = R.nn.pad(o, [0, 0, 3, 0, 0, 0])        # at the front: the slice keeps zeros
                y = R.exp(po)
                out = R.strided_slice(y, [1], [0], [5])
                R.output(out)
            return out

    tvm.ir.assert_structural_equal(_unpadded(Before), Before)


def test_a_pad_of_width_zero_is_its_input():
    """HF pads by ``pad_size = 0`` when L fills its chunks: ``D * pad(x, 0)`` is ``D * x``."""

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((1, 6, 2), "float32"), d: R.Tensor((2,), "float32")) -> R.Tensor((1, 6, 2), "float32"):
            with R.dataflow():
                px = R.nn.pad(x, [0, 0, 0, 0, 0, 0])
                out = R.multiply(d, px)
                R.output(out)
            return out

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((1, 6, 2), "float32"), d: R.Tensor((2,), "float32")) -> R.Tensor((1, 6, 2), "float32"):
            with R.dataflow():
                out = R.multiply(d, x)
                R.output(out)
            return out

    tvm.ir.assert_structural_equal(_unpadded(Before), Expected)
