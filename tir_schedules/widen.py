"""bf16 / fp16 activations of a float32-accumulating ``matmul`` widened in a kernel of their own.

A bf16 Linear layer imports as ``matmul(x, W, out_dtype="float32")`` with both operands bf16
(PyTorch's CPU kernels accumulate in float32 too).  Legalized, every multiply-add widens both
operands; ``dense_cpu``'s tiles read each activation once per column panel, and widening it
there (a scalar shift per broadcast row value) halved the GEMM's speed.  Widening the
activations first, ``astype(x, "float32")``, gives them a kernel of their own (an elementwise
one: parallel, vectorized), and the tiles read float32.  Widening is exact, so nothing a model
computes changes; the weights (constants) stay narrow: packed once, widened in registers, half
the bytes a GEMV streams.  Where the CPU multiplies bf16 itself (AVX512-BF16: ``bf16_dot``),
the activations of a matmul with a weight stay bf16 (its instruction reads them in pairs with
the packed weight); a product of two activations (attention's scores) is still widened.
"""
import tvm
from tvm import relax

from . import bf16_dot

NARROW = ("bfloat16", "float16")


def _dtype(expr):
    return getattr(getattr(expr, "ty", None), "dtype", None)


@relax.expr_functor.mutator
class _Widen(relax.PyExprMutator):
    def __init__(self, mod, with_weights):
        super().__init__(mod)
        self.with_weights = with_weights     # also widen the activations a weight multiplies

    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op) or call.op.name != "relax.matmul" or _dtype(call) != "float32":
            return call
        constant = [self._constant(a) for a in call.args]
        if any(constant) and not self.with_weights and all(_dtype(a) in NARROW for a in call.args):
            return call                      # (bf16 pairs for bf16_dot; an int8 weight is not)
        args = [relax.op.astype(a, "float32") if _dtype(a) in NARROW and not c else a
                for a, c in zip(call.args, constant)]
        if all(a.same_as(b) for a, b in zip(args, call.args)):
            return call
        return relax.op.matmul(args[0], args[1], out_dtype="float32")

    def _constant(self, expr, depth=8):
        """``expr`` is computed from constants only (a weight, ``permute_dims(W)``): it is
        folded at compile time, and stays narrow."""
        if isinstance(expr, tvm.ir.expr.GenericConst):
            return True
        value = self.lookup_binding(expr) if isinstance(expr, relax.Var) and depth > 0 else None
        return isinstance(value, relax.Call) and bool(value.args) and all(
            self._constant(a, depth - 1) for a in value.args if not isinstance(a, relax.ShapeExpr))


def widen_matmul_activations(with_weights=True):
    """The pass: every ``matmul`` with a float32 result gets its bf16 / fp16 operands that are
    not constants widened by an ``astype`` before it; with ``with_weights=False``, not where
    a bf16 / fp16 constant multiplies them (``bf16_dot``'s pairs; an int8 weight's activations
    are widened: see the module's docstring)."""
    @tvm.transform.module_pass(opt_level=0, name="scanweaver.WidenMatmulActivations")
    def _pass(mod, _ctx):
        widen = _Widen(mod, with_weights)
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function):
                widen.builder_.update_func(gv, widen.visit_expr(func))
        return widen.builder_.get()

    return _pass


WidenMatmulActivations = widen_matmul_activations()


def passes(target):
    """The widening ``target`` wants: a weight's activations stay bf16 where it multiplies
    bf16 pairs itself (``bf16_dot``)."""
    return [widen_matmul_activations(with_weights=not bf16_dot.available(target))]
