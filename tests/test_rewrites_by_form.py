"""``Before``/``Expected`` rewrites, one per form (TVM's style): each ``Before`` is a small module
as the torch frontend imports it (``sw.from_torch`` of the loop in its docstring, printed), and
``Expected`` what ``FuseAffineRecurrences`` makes of it, printed once and pinned here.  The
rewrite is deterministic: validation probes the rewrite with seeded random inputs but only
accepts or refuses it, so a refusal would show as ``Expected`` not matching (the module left as
it was).  ``analyze`` pins which form wins."""
import tvm
from tvm.script import ir as I
from tvm.script import relax as R

from relax_pass import FuseAffineRecurrences, analyze


def _check(before, expected, form):
    found = analyze(before)
    assert [(r.form, r.rejected) for r in found] == [(form, False)], found
    tvm.ir.assert_structural_equal(FuseAffineRecurrences()(before), expected)


def test_affine():
    """An unrolled affine chain h_t = a_t * h_{t-1} + b_t (stacked): one ``affine_scan``.

    def affine(a, b):                       # (2, 3, 4): h_t = a_t * h + b_t over dim 1
        h = torch.zeros_like(b[:, 0]); hs = []
        for t in range(3):
            h = a[:, t] * h + b[:, t]; hs.append(h)
        return torch.stack(hs, 1)

    a, b: (2, 3, 4)
    """
    @I.ir_module
    class Before:
        @R.function
        def main(args_0: R.Tensor((2, 3, 4), dtype="float32"), args_1: R.Tensor((2, 3, 4), dtype="float32")) -> R.Tuple(R.Tensor((2, 3, 4), dtype="float32")):
            with R.dataflow():
                lv: R.Tensor((2, 4), dtype="float32") = R.take(args_1, R.const(0, "int64"), axis=1, mode="clip")
                lv1: R.Tensor((2, 4), dtype="float32") = R.full_like(lv, R.const(0.0, "float32"), dtype=None)
                lv2: R.Tensor((2, 4), dtype="float32") = R.take(args_0, R.const(0, "int64"), axis=1, mode="clip")
                lv3: R.Tensor((2, 4), dtype="float32") = R.multiply(lv2, lv1)
                lv4: R.Tensor((2, 4), dtype="float32") = R.take(args_1, R.const(0, "int64"), axis=1, mode="clip")
                lv5: R.Tensor((2, 4), dtype="float32") = R.add(lv3, lv4)
                lv6: R.Tensor((2, 4), dtype="float32") = R.take(args_0, R.const(1, "int64"), axis=1, mode="clip")
                lv7: R.Tensor((2, 4), dtype="float32") = R.multiply(lv6, lv5)
                lv8: R.Tensor((2, 4), dtype="float32") = R.take(args_1, R.const(1, "int64"), axis=1, mode="clip")
                lv9: R.Tensor((2, 4), dtype="float32") = R.add(lv7, lv8)
                lv10: R.Tensor((2, 4), dtype="float32") = R.take(args_0, R.const(2, "int64"), axis=1, mode="clip")
                lv11: R.Tensor((2, 4), dtype="float32") = R.multiply(lv10, lv9)
                lv12: R.Tensor((2, 4), dtype="float32") = R.take(args_1, R.const(2, "int64"), axis=1, mode="clip")
                lv13: R.Tensor((2, 4), dtype="float32") = R.add(lv11, lv12)
                lv14: R.Tensor((2, 12), dtype="float32") = R.concat((lv5, lv9, lv13), axis=1)
                lv15: R.Tensor((2, 3, 4), dtype="float32") = R.reshape(lv14, R.shape([2, 3, 4]))
                gv: R.Tuple(R.Tensor((2, 3, 4), dtype="float32")) = (lv15,)
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function
        def main(args_0: R.Tensor((2, 3, 4), dtype="float32"), args_1: R.Tensor((2, 3, 4), dtype="float32")) -> R.Tuple(R.Tensor((2, 3, 4), dtype="float32")):
            with R.dataflow():
                lv: R.Tensor((2, 3, 4), dtype="float32") = R.call_pure_packed("scanweaver.affine_scan", args_0, args_1, R.str("{\"a_shape\": [2, 3, 4], \"axis\": 1, \"dtype\": \"float32\", \"has_h0\": false, \"outputs\": [\"states\"], \"reverse\": false, \"shape\": [2, 3, 4]}"), ty_args=(R.Tensor((2, 3, 4), dtype="float32"),))
                lv1: R.Tensor((2, 4, 3), dtype="float32") = R.permute_dims(lv, axes=[0, 2, 1])
                lv2: R.Tensor((2, 3, 4), dtype="float32") = R.permute_dims(lv1, axes=[0, 2, 1])
                lv3: R.Tensor((2, 12), dtype="float32") = R.reshape(lv2, R.shape([2, 12]))
                lv15: R.Tensor((2, 3, 4), dtype="float32") = R.reshape(lv3, R.shape([2, 3, 4]))
                gv: R.Tuple(R.Tensor((2, 3, 4), dtype="float32")) = (lv15,)
                R.output(gv)
            return gv

    _check(Before, Expected, "affine")


def test_selective():
    """Mamba's selective scan (exp(delta A), delta B u, readout with C): one ``selective_scan``.

    def selective(u, delta, A, Bm, C):      # Mamba: u, delta (B, D, L); A (D, N); B, C (B, N, L)
        dA = torch.exp(delta[..., None] * A[:, None, :])          # (B, D, L, N)
        dBu = delta[..., None] * Bm.transpose(1, 2)[:, None] * u[..., None]
        h = torch.zeros(u.shape[0], u.shape[1], A.shape[1]); ys = []
        for t in range(u.shape[2]):
            h = dA[:, :, t] * h + dBu[:, :, t]
            ys.append((h * C[:, None, :, t]).sum(-1))
        return torch.stack(ys, 2)

    u, delta: (1, 2, 2); A: (2, 3); B, C: (1, 3, 2)
    """
    @I.ir_module
    class Before:
        @R.function
        def main(args_0: R.Tensor((1, 2, 2), dtype="float32"), args_1: R.Tensor((1, 2, 2), dtype="float32"), args_2: R.Tensor((2, 3), dtype="float32"), args_3: R.Tensor((1, 3, 2), dtype="float32"), args_4: R.Tensor((1, 3, 2), dtype="float32")) -> R.Tuple(R.Tensor((1, 2, 2), dtype="float32")):
            with R.dataflow():
                lv: R.Tensor((1, 2, 2, 1), dtype="float32") = R.expand_dims(args_1, axis=[3])
                lv1: R.Tensor((2, 1, 3), dtype="float32") = R.expand_dims(args_2, axis=[1])
                lv2: R.Tensor((1, 2, 2, 3), dtype="float32") = R.multiply(lv, lv1)
                lv3: R.Tensor((1, 2, 2, 3), dtype="float32") = R.exp(lv2)
                lv4: R.Tensor((1, 2, 2, 1), dtype="float32") = R.expand_dims(args_1, axis=[3])
                lv5: R.Tensor((1, 2, 3), dtype="float32") = R.permute_dims(args_3, axes=[0, 2, 1])
                lv6: R.Tensor((1, 1, 2, 3), dtype="float32") = R.expand_dims(lv5, axis=[1])
                lv7: R.Tensor((1, 2, 2, 3), dtype="float32") = R.multiply(lv4, lv6)
                lv8: R.Tensor((1, 2, 2, 1), dtype="float32") = R.expand_dims(args_0, axis=[3])
                lv9: R.Tensor((1, 2, 2, 3), dtype="float32") = R.multiply(lv7, lv8)
                lv10: R.Tensor((1, 2, 3), dtype="float32") = R.full(R.shape([1, 2, 3]), R.const(0.0, "float32"), dtype="float32")
                lv11: R.Tensor((1, 2, 3), dtype="float32") = R.take(lv3, R.const(0, "int64"), axis=2, mode="clip")
                lv12: R.Tensor((1, 2, 3), dtype="float32") = R.multiply(lv11, lv10)
                lv13: R.Tensor((1, 2, 3), dtype="float32") = R.take(lv9, R.const(0, "int64"), axis=2, mode="clip")
                lv14: R.Tensor((1, 2, 3), dtype="float32") = R.add(lv12, lv13)
                lv15: R.Tensor((1, 1, 3, 2), dtype="float32") = R.expand_dims(args_4, axis=[1])
                lv16: R.Tensor((1, 1, 3), dtype="float32") = R.take(lv15, R.const(0, "int64"), axis=3, mode="clip")
                lv17: R.Tensor((1, 2, 3), dtype="float32") = R.multiply(lv14, lv16)
                lv18: R.Tensor((1, 2), dtype="float32") = R.sum(lv17, axis=[-1], keepdims=False)
                lv19: R.Tensor((1, 2, 3), dtype="float32") = R.take(lv3, R.const(1, "int64"), axis=2, mode="clip")
                lv20: R.Tensor((1, 2, 3), dtype="float32") = R.multiply(lv19, lv14)
                lv21: R.Tensor((1, 2, 3), dtype="float32") = R.take(lv9, R.const(1, "int64"), axis=2, mode="clip")
                lv22: R.Tensor((1, 2, 3), dtype="float32") = R.add(lv20, lv21)
                lv23: R.Tensor((1, 1, 3, 2), dtype="float32") = R.expand_dims(args_4, axis=[1])
                lv24: R.Tensor((1, 1, 3), dtype="float32") = R.take(lv23, R.const(1, "int64"), axis=3, mode="clip")
                lv25: R.Tensor((1, 2, 3), dtype="float32") = R.multiply(lv22, lv24)
                lv26: R.Tensor((1, 2), dtype="float32") = R.sum(lv25, axis=[-1], keepdims=False)
                lv27: R.Tensor((1, 2, 1), dtype="float32") = R.expand_dims(lv18, axis=[2])
                lv28: R.Tensor((1, 2, 1), dtype="float32") = R.expand_dims(lv26, axis=[2])
                lv29: R.Tensor((1, 2, 2), dtype="float32") = R.concat((lv27, lv28), axis=2)
                gv: R.Tuple(R.Tensor((1, 2, 2), dtype="float32")) = (lv29,)
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function
        def main(args_0: R.Tensor((1, 2, 2), dtype="float32"), args_1: R.Tensor((1, 2, 2), dtype="float32"), args_2: R.Tensor((2, 3), dtype="float32"), args_3: R.Tensor((1, 3, 2), dtype="float32"), args_4: R.Tensor((1, 3, 2), dtype="float32")) -> R.Tuple(R.Tensor((1, 2, 2), dtype="float32")):
            with R.dataflow():
                lv5: R.Tensor((1, 2, 3), dtype="float32") = R.permute_dims(args_3, axes=[0, 2, 1])
                lv15: R.Tensor((1, 1, 3, 2), dtype="float32") = R.expand_dims(args_4, axis=[1])
                lv: R.Tensor((3, 2, 1), dtype="float32") = R.permute_dims(lv5, axes=[2, 1, 0])
                lv1: R.Tensor((1, 3, 2), dtype="float32") = R.reshape(lv, R.shape([1, 3, 2]))
                lv2: R.Tensor((1, 3, 2), dtype="float32") = R.reshape(lv15, R.shape([1, 3, 2]))
                selective_scan: R.Tensor((1, 2, 2), dtype="float32") = R.call_pure_packed("scanweaver.selective_scan", args_0, args_1, args_2, lv1, lv2, R.str("{\"batch\": 1, \"delta_softplus\": false, \"dim\": 2, \"dstate\": 3, \"dtype\": \"float32\", \"groups\": 0, \"has_D\": false, \"has_delta_bias\": false, \"has_h0\": false, \"has_z\": false, \"length\": 2, \"return_last_state\": false}"), ty_args=(R.Tensor((1, 2, 2), dtype="float32"),))
                gv: R.Tuple(R.Tensor((1, 2, 2), dtype="float32")) = (selective_scan,)
                R.output(gv)
            return gv

    _check(Before, Expected, "selective")


def test_matrix():
    """A GLA loop with a (K, V) matrix state read out per step: one matrix scan.

    def matrix(q, k, v, gk):                 # GLA per step
        b, h, l, dk = q.shape
        state = torch.zeros(b, h, dk, v.shape[-1]); outs = []
        for t in range(l):
            state = state * torch.exp(gk[:, :, t])[..., None] + k[:, :, t, :, None] * v[:, :, t, None, :]
            outs.append((q[:, :, t, :, None] * state).sum(-2))
        return torch.stack(outs, dim=2)

    q, k, gk: (1, 1, 2, 3); v: (1, 1, 2, 2)
    """
    @I.ir_module
    class Before:
        @R.function
        def main(args_0: R.Tensor((1, 1, 2, 3), dtype="float32"), args_1: R.Tensor((1, 1, 2, 3), dtype="float32"), args_2: R.Tensor((1, 1, 2, 2), dtype="float32"), args_3: R.Tensor((1, 1, 2, 3), dtype="float32")) -> R.Tuple(R.Tensor((1, 1, 2, 2), dtype="float32")):
            with R.dataflow():
                lv: R.Tensor((1, 1, 3, 2), dtype="float32") = R.full(R.shape([1, 1, 3, 2]), R.const(0.0, "float32"), dtype="float32")
                lv1: R.Tensor((1, 1, 3), dtype="float32") = R.take(args_3, R.const(0, "int64"), axis=2, mode="clip")
                lv2: R.Tensor((1, 1, 3), dtype="float32") = R.exp(lv1)
                lv3: R.Tensor((1, 1, 3, 1), dtype="float32") = R.expand_dims(lv2, axis=[3])
                lv4: R.Tensor((1, 1, 3, 2), dtype="float32") = R.multiply(lv, lv3)
                lv5: R.Tensor((1, 1, 3), dtype="float32") = R.take(args_1, R.const(0, "int64"), axis=2, mode="clip")
                lv6: R.Tensor((1, 1, 3, 1), dtype="float32") = R.expand_dims(lv5, axis=[3])
                lv7: R.Tensor((1, 1, 2), dtype="float32") = R.take(args_2, R.const(0, "int64"), axis=2, mode="clip")
                lv8: R.Tensor((1, 1, 1, 2), dtype="float32") = R.expand_dims(lv7, axis=[2])
                lv9: R.Tensor((1, 1, 3, 2), dtype="float32") = R.multiply(lv6, lv8)
                lv10: R.Tensor((1, 1, 3, 2), dtype="float32") = R.add(lv4, lv9)
                lv11: R.Tensor((1, 1, 3), dtype="float32") = R.take(args_0, R.const(0, "int64"), axis=2, mode="clip")
                lv12: R.Tensor((1, 1, 3, 1), dtype="float32") = R.expand_dims(lv11, axis=[3])
                lv13: R.Tensor((1, 1, 3, 2), dtype="float32") = R.multiply(lv12, lv10)
                lv14: R.Tensor((1, 1, 2), dtype="float32") = R.sum(lv13, axis=[-2], keepdims=False)
                lv15: R.Tensor((1, 1, 3), dtype="float32") = R.take(args_3, R.const(1, "int64"), axis=2, mode="clip")
                lv16: R.Tensor((1, 1, 3), dtype="float32") = R.exp(lv15)
                lv17: R.Tensor((1, 1, 3, 1), dtype="float32") = R.expand_dims(lv16, axis=[3])
                lv18: R.Tensor((1, 1, 3, 2), dtype="float32") = R.multiply(lv10, lv17)
                lv19: R.Tensor((1, 1, 3), dtype="float32") = R.take(args_1, R.const(1, "int64"), axis=2, mode="clip")
                lv20: R.Tensor((1, 1, 3, 1), dtype="float32") = R.expand_dims(lv19, axis=[3])
                lv21: R.Tensor((1, 1, 2), dtype="float32") = R.take(args_2, R.const(1, "int64"), axis=2, mode="clip")
                lv22: R.Tensor((1, 1, 1, 2), dtype="float32") = R.expand_dims(lv21, axis=[2])
                lv23: R.Tensor((1, 1, 3, 2), dtype="float32") = R.multiply(lv20, lv22)
                lv24: R.Tensor((1, 1, 3, 2), dtype="float32") = R.add(lv18, lv23)
                lv25: R.Tensor((1, 1, 3), dtype="float32") = R.take(args_0, R.const(1, "int64"), axis=2, mode="clip")
                lv26: R.Tensor((1, 1, 3, 1), dtype="float32") = R.expand_dims(lv25, axis=[3])
                lv27: R.Tensor((1, 1, 3, 2), dtype="float32") = R.multiply(lv26, lv24)
                lv28: R.Tensor((1, 1, 2), dtype="float32") = R.sum(lv27, axis=[-2], keepdims=False)
                lv29: R.Tensor((1, 1, 4), dtype="float32") = R.concat((lv14, lv28), axis=2)
                lv30: R.Tensor((1, 1, 2, 2), dtype="float32") = R.reshape(lv29, R.shape([1, 1, 2, 2]))
                gv: R.Tuple(R.Tensor((1, 1, 2, 2), dtype="float32")) = (lv30,)
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function
        def main(args_0: R.Tensor((1, 1, 2, 3), dtype="float32"), args_1: R.Tensor((1, 1, 2, 3), dtype="float32"), args_2: R.Tensor((1, 1, 2, 2), dtype="float32"), args_3: R.Tensor((1, 1, 2, 3), dtype="float32")) -> R.Tuple(R.Tensor((1, 1, 2, 2), dtype="float32")):
            with R.dataflow():
                lv: R.Tensor((2, 3, 1, 1), dtype="float32") = R.permute_dims(args_0, axes=[2, 3, 0, 1])
                lv1: R.Tensor((1, 1, 2, 3), dtype="float32") = R.reshape(lv, R.shape([1, 1, 2, 3]))
                lv2: R.Tensor((2, 3, 1, 1), dtype="float32") = R.permute_dims(args_1, axes=[2, 3, 0, 1])
                lv3: R.Tensor((1, 1, 2, 3), dtype="float32") = R.reshape(lv2, R.shape([1, 1, 2, 3]))
                lv4: R.Tensor((2, 2, 1, 1), dtype="float32") = R.permute_dims(args_2, axes=[2, 3, 0, 1])
                lv5: R.Tensor((1, 1, 2, 2), dtype="float32") = R.reshape(lv4, R.shape([1, 1, 2, 2]))
                lv6: R.Tensor((1, 1, 2, 3), dtype="float32") = R.exp(args_3)
                lv7: R.Tensor((2, 1, 1, 3), dtype="float32") = R.permute_dims(lv6, axes=[2, 0, 1, 3])
                lv8: R.Tensor((2, 1, 1, 3, 1), dtype="float32") = R.expand_dims(lv7, axis=[4])
                lv9: R.Tensor((2, 3, 1, 1, 1), dtype="float32") = R.permute_dims(lv8, axes=[0, 3, 1, 2, 4])
                lv10: R.Tensor((1, 1, 2, 3), dtype="float32") = R.reshape(lv9, R.shape([1, 1, 2, 3]))
                matrix_scan: R.Tensor((1, 1, 2, 2), dtype="float32") = R.call_pure_packed("scanweaver.matrix_scan", lv1, lv3, lv5, lv10, R.str("{\"batch\": 1, \"decay\": \"key\", \"dt_softplus\": false, \"dtype\": \"float32\", \"g_shape\": [1, 1, 2, 3], \"has_dt_bias\": false, \"has_gate\": false, \"has_h0\": false, \"has_skip\": false, \"heads\": 1, \"k_shape\": [1, 1, 2, 3], \"key\": 3, \"layout\": \"time_major\", \"length\": 2, \"q_shape\": [1, 1, 2, 3], \"return_last_state\": false, \"reverse\": false, \"v_shape\": [1, 1, 2, 2], \"value\": 2}"), ty_args=(R.Tensor((1, 1, 2, 2), dtype="float32"),))
                lv11: R.Tensor((2, 2), dtype="float32") = R.reshape(matrix_scan, R.shape([2, 2]))
                lv12: R.Tensor((1, 1, 2, 2), dtype="float32") = R.reshape(lv11, R.shape([1, 1, 2, 2]))
                gv: R.Tuple(R.Tensor((1, 1, 2, 2), dtype="float32")) = (lv12,)
                R.output(gv)
            return gv

    _check(Before, Expected, "matrix")


def test_chunked():
    """fla's naive chunk simple GLA (a chunked region, padded, in-place writes): one matrix scan, the padding gone.

    tests/test_chunked_forms.py::ChunkSimpleGLA(chunk=2)

    q, k, v: (1, 4, 1, 2); g: (1, 4, 1)
    """
    @I.ir_module
    class Before:
        @R.function
        def main(q: R.Tensor((1, 4, 1, 2), dtype="float32"), k: R.Tensor((1, 4, 1, 2), dtype="float32"), v: R.Tensor((1, 4, 1, 2), dtype="float32"), g: R.Tensor((1, 4, 1), dtype="float32")) -> R.Tuple(R.Tensor((1, 4, 1, 2), dtype="float32")):
            with R.dataflow():
                lv: R.Tensor((1, 1, 4, 2), dtype="float32") = R.permute_dims(q, axes=[0, 2, 1, 3])
                lv1: R.Tensor((1, 1, 4, 2), dtype="float32") = R.permute_dims(k, axes=[0, 2, 1, 3])
                lv2: R.Tensor((1, 1, 4, 2), dtype="float32") = R.permute_dims(v, axes=[0, 2, 1, 3])
                lv3: R.Tensor((1, 1, 4), dtype="float32") = R.permute_dims(g, axes=[0, 2, 1])
                lv4: R.Tensor((1, 1, 4, 2), dtype="float32") = R.multiply(lv, R.const(0.70710676908493042, "float32"))
                lv5: R.Tensor((1, 1, 2, 2, 2), dtype="float32") = R.reshape(lv4, R.shape([1, 1, 2, 2, 2]))
                lv6: R.Tensor((1, 1, 2, 2, 2), dtype="float32") = R.reshape(lv1, R.shape([1, 1, 2, 2, 2]))
                lv7: R.Tensor((1, 1, 2, 2, 2), dtype="float32") = R.reshape(lv2, R.shape([1, 1, 2, 2, 2]))
                lv8: R.Tensor((1, 1, 2, 2), dtype="float32") = R.reshape(lv3, R.shape([1, 1, 2, 2]))
                lv9: R.Tensor((1, 1, 2, 2), dtype="float32") = R.cumsum(lv8, axis=-1, dtype=None, exclusive=False)
                lv10: R.Tensor((1, 1, 2, 2, 1), dtype="float32") = R.expand_dims(lv9, axis=[-1])
                lv11: R.Tensor((1, 1, 2, 1, 2), dtype="float32") = R.expand_dims(lv9, axis=[-2])
                lv12: R.Tensor((1, 1, 2, 2, 2), dtype="float32") = R.subtract(lv10, lv11)
                lv13: R.Tensor((2,), dtype="int64") = R.arange(0, 2, 1, dtype="int64")
                lv14: R.Tensor((1, 2), dtype="int64") = R.expand_dims(lv13, axis=[-2])
                lv15: R.Tensor((2,), dtype="int64") = R.arange(0, 2, 1, dtype="int64")
                lv16: R.Tensor((2, 1), dtype="int64") = R.expand_dims(lv15, axis=[-1])
                lv17: R.Tensor((2, 2), dtype="int64") = R.subtract(lv14, lv16)
                lv18: R.Tensor((2, 2), dtype="bool") = R.less_equal(lv17, R.const(0, "int64"))
                lv19: R.Tensor((), dtype="float32") = R.const(0.0, "float32")
                lv20: R.Tensor((1, 1, 2, 2, 2), dtype="float32") = R.where(lv18, lv12, lv19)
                lv21: R.Tensor((1, 1, 2, 2, 2), dtype="float32") = R.exp(lv20)
                lv22: R.Tensor((2,), dtype="int64") = R.arange(0, 2, 1, dtype="int64")
                lv23: R.Tensor((1, 2), dtype="int64") = R.expand_dims(lv22, axis=[-2])
                lv24: R.Tensor((2,), dtype="int64") = R.arange(0, 2, 1, dtype="int64")
                lv25: R.Tensor((2, 1), dtype="int64") = R.expand_dims(lv24, axis=[-1])
                lv26: R.Tensor((2, 2), dtype="int64") = R.subtract(lv23, lv25)
                lv27: R.Tensor((2, 2), dtype="bool") = R.less_equal(lv26, R.const(0, "int64"))
                lv28: R.Tensor((), dtype="float32") = R.const(0.0, "float32")
                lv29: R.Tensor((1, 1, 2, 2, 2), dtype="float32") = R.where(lv27, lv21, lv28)
                lv30: R.Tensor((1, 1, 2, 2), dtype="float32") = R.full(R.shape([1, 1, 2, 2]), R.const(0.0, "float32"), dtype="float32")
                lv31: R.Tensor((1, 1, 2, 2, 2), dtype="float32") = R.full_like(lv7, R.const(0.0, "float32"), dtype=None)
                lv32: R.Tensor((1, 1, 2, 2), dtype="float32") = R.take(lv5, R.const(0, "int64"), axis=2, mode="clip")
                lv33: R.Tensor((1, 1, 2, 2), dtype="float32") = R.take(lv6, R.const(0, "int64"), axis=2, mode="clip")
                lv34: R.Tensor((1, 1, 2, 2), dtype="float32") = R.take(lv7, R.const(0, "int64"), axis=2, mode="clip")
                lv35: R.Tensor((1, 1, 2, 2), dtype="float32") = R.permute_dims(lv33, axes=[0, 1, 3, 2])
                lv36: R.Tensor((1, 1, 2, 2), dtype="float32") = R.broadcast_to(lv32, R.shape([1, 1, 2, 2]))
                lv37: R.Tensor((1, 2, 2), dtype="float32") = R.reshape(lv36, R.shape([1, 2, 2]))
                lv38: R.Tensor((1, 1, 2, 2), dtype="float32") = R.broadcast_to(lv35, R.shape([1, 1, 2, 2]))
                lv39: R.Tensor((1, 2, 2), dtype="float32") = R.reshape(lv38, R.shape([1, 2, 2]))
                lv40: R.Tensor((1, 2, 2), dtype="float32") = R.matmul(lv37, lv39, out_dtype="float32")
                lv41: R.Tensor((1, 1, 2, 2), dtype="float32") = R.reshape(lv40, R.shape([1, 1, 2, 2]))
                lv42: R.Tensor((1, 1, 2, 2), dtype="float32") = R.take(lv29, R.const(0, "int64"), axis=2, mode="clip")
                lv43: R.Tensor((1, 1, 2, 2), dtype="float32") = R.multiply(lv41, lv42)
                lv44: R.Tensor((1, 1, 2), dtype="float32") = R.take(lv9, R.const(0, "int64"), axis=2, mode="clip")
                lv45: R.Tensor((1, 1, 2, 1), dtype="float32") = R.expand_dims(lv44, axis=[3])
                lv46: R.Tensor((1, 1, 2, 1), dtype="float32") = R.exp(lv45)
                lv47: R.Tensor((1, 1, 2, 2), dtype="float32") = R.multiply(lv32, lv46)
                lv48: R.Tensor((1, 1, 2, 2), dtype="float32") = R.broadcast_to(lv47, R.shape([1, 1, 2, 2]))
                lv49: R.Tensor((1, 2, 2), dtype="float32") = R.reshape(lv48, R.shape([1, 2, 2]))
                lv50: R.Tensor((1, 1, 2, 2), dtype="float32") = R.broadcast_to(lv30, R.shape([1, 1, 2, 2]))
                lv51: R.Tensor((1, 2, 2), dtype="float32") = R.reshape(lv50, R.shape([1, 2, 2]))
                lv52: R.Tensor((1, 2, 2), dtype="float32") = R.matmul(lv49, lv51, out_dtype="float32")
                lv53: R.Tensor((1, 1, 2, 2), dtype="float32") = R.reshape(lv52, R.shape([1, 1, 2, 2]))
                lv54: R.Tensor((1, 1, 2, 2), dtype="float32") = R.broadcast_to(lv43, R.shape([1, 1, 2, 2]))
                lv55: R.Tensor((1, 2, 2), dtype="float32") = R.reshape(lv54, R.shape([1, 2, 2]))
                lv56: R.Tensor((1, 1, 2, 2), dtype="float32") = R.broadcast_to(lv34, R.shape([1, 1, 2, 2]))
                lv57: R.Tensor((1, 2, 2), dtype="float32") = R.reshape(lv56, R.shape([1, 2, 2]))
                lv58: R.Tensor((1, 2, 2), dtype="float32") = R.matmul(lv55, lv57, out_dtype="float32")
                lv59: R.Tensor((1, 1, 2, 2), dtype="float32") = R.reshape(lv58, R.shape([1, 1, 2, 2]))
                lv60: R.Tensor((1, 1, 2, 2), dtype="float32") = R.add(lv53, lv59)
                lv61: R.Tensor((1, 1, 2, 2), dtype="float32") = R.take(lv31, R.const(0, "int64"), axis=2, mode="clip")
                lv62: R.Tensor((1, 1, 2, 2), dtype="float32") = R.broadcast_to(lv60, R.shape([1, 1, 2, 2]))
                lv63: R.Tensor((2,), dtype="int64") = R.arange(0, 2, 1, dtype="int64")
                lv64: R.Tensor((1, 1, 2, 1, 1), dtype="int64") = R.reshape(lv63, R.shape([1, 1, 2, 1, 1]))
                lv65: R.Tensor((1, 1, 2, 1, 1), dtype="bool") = R.equal(lv64, R.const(0, "int64"))
                lv66: R.Tensor((1, 1, 1, 2, 2), dtype="float32") = R.expand_dims(lv62, axis=[2])
                lv67: R.Tensor((1, 1, 2, 2, 2), dtype="float32") = R.broadcast_to(lv66, R.shape([1, 1, 2, 2, 2]))
                lv68: R.Tensor((1, 1, 2, 2, 2), dtype="float32") = R.where(lv65, lv67, lv31)
                lv69: R.Tensor((1, 1, 2), dtype="float32") = R.take(lv9, R.const(0, "int64"), axis=2, mode="clip")
                lv70: R.Tensor((1, 1), dtype="float32") = R.take(lv69, R.const(1, "int64"), axis=2, mode="clip")
                lv71: R.Tensor((1, 1, 1), dtype="float32") = R.expand_dims(lv70, axis=[2])
                lv72: R.Tensor((1, 1, 1, 1), dtype="float32") = R.expand_dims(lv71, axis=[3])
                lv73: R.Tensor((1, 1, 1, 1), dtype="float32") = R.exp(lv72)
                lv74: R.Tensor((1, 1, 2, 2), dtype="float32") = R.multiply(lv30, lv73)
                lv75: R.Tensor((1, 1, 2), dtype="float32") = R.take(lv9, R.const(0, "int64"), axis=2, mode="clip")
                lv76: R.Tensor((1, 1), dtype="float32") = R.take(lv75, R.const(1, "int64"), axis=2, mode="clip")
                lv77: R.Tensor((1, 1, 1), dtype="float32") = R.expand_dims(lv76, axis=[2])
                lv78: R.Tensor((1, 1, 2), dtype="float32") = R.take(lv9, R.const(0, "int64"), axis=2, mode="clip")
                lv79: R.Tensor((1, 1, 2), dtype="float32") = R.subtract(lv77, lv78)
                lv80: R.Tensor((1, 1, 2), dtype="float32") = R.exp(lv79)
                lv81: R.Tensor((1, 1, 2, 1), dtype="float32") = R.expand_dims(lv80, axis=[3])
                lv82: R.Tensor((1, 1, 2, 2), dtype="float32") = R.multiply(lv33, lv81)
                lv83: R.Tensor((1, 1, 2, 2), dtype="float32") = R.permute_dims(lv82, axes=[0, 1, 3, 2])
                lv84: R.Tensor((1, 1, 2, 2), dtype="float32") = R.broadcast_to(lv83, R.shape([1, 1, 2, 2]))
                lv85: R.Tensor((1, 2, 2), dtype="float32") = R.reshape(lv84, R.shape([1, 2, 2]))
                lv86: R.Tensor((1, 1, 2, 2), dtype="float32") = R.broadcast_to(lv34, R.shape([1, 1, 2, 2]))
                lv87: R.Tensor((1, 2, 2), dtype="float32") = R.reshape(lv86, R.shape([1, 2, 2]))
                lv88: R.Tensor((1, 2, 2), dtype="float32") = R.matmul(lv85, lv87, out_dtype="float32")
                lv89: R.Tensor((1, 1, 2, 2), dtype="float32") = R.reshape(lv88, R.shape([1, 1, 2, 2]))
                lv90: R.Tensor((1, 1, 2, 2), dtype="float32") = R.add(lv74, lv89)
                lv91: R.Tensor((1, 1, 2, 2), dtype="float32") = R.take(lv5, R.const(1, "int64"), axis=2, mode="clip")
                lv92: R.Tensor((1, 1, 2, 2), dtype="float32") = R.take(lv6, R.const(1, "int64"), axis=2, mode="clip")
                lv93: R.Tensor((1, 1, 2, 2), dtype="float32") = R.take(lv7, R.const(1, "int64"), axis=2, mode="clip")
                lv94: R.Tensor((1, 1, 2, 2), dtype="float32") = R.permute_dims(lv92, axes=[0, 1, 3, 2])
                lv95: R.Tensor((1, 1, 2, 2), dtype="float32") = R.broadcast_to(lv91, R.shape([1, 1, 2, 2]))
                lv96: R.Tensor((1, 2, 2), dtype="float32") = R.reshape(lv95, R.shape([1, 2, 2]))
                lv97: R.Tensor((1, 1, 2, 2), dtype="float32") = R.broadcast_to(lv94, R.shape([1, 1, 2, 2]))
                lv98: R.Tensor((1, 2, 2), dtype="float32") = R.reshape(lv97, R.shape([1, 2, 2]))
                lv99: R.Tensor((1, 2, 2), dtype="float32") = R.matmul(lv96, lv98, out_dtype="float32")
                lv100: R.Tensor((1, 1, 2, 2), dtype="float32") = R.reshape(lv99, R.shape([1, 1, 2, 2]))
                lv101: R.Tensor((1, 1, 2, 2), dtype="float32") = R.take(lv29, R.const(1, "int64"), axis=2, mode="clip")
                lv102: R.Tensor((1, 1, 2, 2), dtype="float32") = R.multiply(lv100, lv101)
                lv103: R.Tensor((1, 1, 2), dtype="float32") = R.take(lv9, R.const(1, "int64"), axis=2, mode="clip")
                lv104: R.Tensor((1, 1, 2, 1), dtype="float32") = R.expand_dims(lv103, axis=[3])
                lv105: R.Tensor((1, 1, 2, 1), dtype="float32") = R.exp(lv104)
                lv106: R.Tensor((1, 1, 2, 2), dtype="float32") = R.multiply(lv91, lv105)
                lv107: R.Tensor((1, 1, 2, 2), dtype="float32") = R.broadcast_to(lv106, R.shape([1, 1, 2, 2]))
                lv108: R.Tensor((1, 2, 2), dtype="float32") = R.reshape(lv107, R.shape([1, 2, 2]))
                lv109: R.Tensor((1, 1, 2, 2), dtype="float32") = R.broadcast_to(lv90, R.shape([1, 1, 2, 2]))
                lv110: R.Tensor((1, 2, 2), dtype="float32") = R.reshape(lv109, R.shape([1, 2, 2]))
                lv111: R.Tensor((1, 2, 2), dtype="float32") = R.matmul(lv108, lv110, out_dtype="float32")
                lv112: R.Tensor((1, 1, 2, 2), dtype="float32") = R.reshape(lv111, R.shape([1, 1, 2, 2]))
                lv113: R.Tensor((1, 1, 2, 2), dtype="float32") = R.broadcast_to(lv102, R.shape([1, 1, 2, 2]))
                lv114: R.Tensor((1, 2, 2), dtype="float32") = R.reshape(lv113, R.shape([1, 2, 2]))
                lv115: R.Tensor((1, 1, 2, 2), dtype="float32") = R.broadcast_to(lv93, R.shape([1, 1, 2, 2]))
                lv116: R.Tensor((1, 2, 2), dtype="float32") = R.reshape(lv115, R.shape([1, 2, 2]))
                lv117: R.Tensor((1, 2, 2), dtype="float32") = R.matmul(lv114, lv116, out_dtype="float32")
                lv118: R.Tensor((1, 1, 2, 2), dtype="float32") = R.reshape(lv117, R.shape([1, 1, 2, 2]))
                lv119: R.Tensor((1, 1, 2, 2), dtype="float32") = R.add(lv112, lv118)
                lv120: R.Tensor((1, 1, 2, 2), dtype="float32") = R.take(lv68, R.const(1, "int64"), axis=2, mode="clip")
                lv121: R.Tensor((1, 1, 2, 2), dtype="float32") = R.broadcast_to(lv119, R.shape([1, 1, 2, 2]))
                lv122: R.Tensor((2,), dtype="int64") = R.arange(0, 2, 1, dtype="int64")
                lv123: R.Tensor((1, 1, 2, 1, 1), dtype="int64") = R.reshape(lv122, R.shape([1, 1, 2, 1, 1]))
                lv124: R.Tensor((1, 1, 2, 1, 1), dtype="bool") = R.equal(lv123, R.const(1, "int64"))
                lv125: R.Tensor((1, 1, 1, 2, 2), dtype="float32") = R.expand_dims(lv121, axis=[2])
                lv126: R.Tensor((1, 1, 2, 2, 2), dtype="float32") = R.broadcast_to(lv125, R.shape([1, 1, 2, 2, 2]))
                lv127: R.Tensor((1, 1, 2, 2, 2), dtype="float32") = R.where(lv124, lv126, lv68)
                lv128: R.Tensor((1, 1, 4, 2), dtype="float32") = R.reshape(lv127, R.shape([1, 1, 4, 2]))
                lv129: R.Tensor((1, 4, 1, 2), dtype="float32") = R.permute_dims(lv128, axes=[0, 2, 1, 3])
                gv: R.Tuple(R.Tensor((1, 4, 1, 2), dtype="float32")) = (lv129,)
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function
        def main(q: R.Tensor((1, 4, 1, 2), dtype="float32"), k: R.Tensor((1, 4, 1, 2), dtype="float32"), v: R.Tensor((1, 4, 1, 2), dtype="float32"), g: R.Tensor((1, 4, 1), dtype="float32")) -> R.Tuple(R.Tensor((1, 4, 1, 2), dtype="float32")):
            with R.dataflow():
                lv: R.Tensor((1, 1, 4, 2), dtype="float32") = R.permute_dims(q, axes=[0, 2, 1, 3])
                lv1: R.Tensor((1, 1, 4, 2), dtype="float32") = R.permute_dims(k, axes=[0, 2, 1, 3])
                lv2: R.Tensor((1, 1, 4, 2), dtype="float32") = R.permute_dims(v, axes=[0, 2, 1, 3])
                lv3: R.Tensor((1, 1, 4), dtype="float32") = R.permute_dims(g, axes=[0, 2, 1])
                lv4: R.Tensor((1, 1, 4, 2), dtype="float32") = R.multiply(lv, R.const(0.70710676908493042, "float32"))
                lv_1: R.Tensor((4, 2, 1, 1), dtype="float32") = R.permute_dims(lv4, axes=[2, 3, 0, 1])
                lv1_1: R.Tensor((1, 1, 4, 2), dtype="float32") = R.reshape(lv_1, R.shape([1, 1, 4, 2]))
                lv2_1: R.Tensor((4, 2, 1, 1), dtype="float32") = R.permute_dims(lv1, axes=[2, 3, 0, 1])
                lv3_1: R.Tensor((1, 1, 4, 2), dtype="float32") = R.reshape(lv2_1, R.shape([1, 1, 4, 2]))
                lv4_1: R.Tensor((4, 2, 1, 1), dtype="float32") = R.permute_dims(lv2, axes=[2, 3, 0, 1])
                lv5: R.Tensor((1, 1, 4, 2), dtype="float32") = R.reshape(lv4_1, R.shape([1, 1, 4, 2]))
                lv6: R.Tensor((4, 1, 1), dtype="float32") = R.permute_dims(lv3, axes=[2, 0, 1])
                lv7: R.Tensor((1, 1, 4, 1), dtype="float32") = R.reshape(lv6, R.shape([1, 1, 4, 1]))
                lv8: R.Tensor((1, 1, 4, 1), dtype="float32") = R.exp(lv7)
                matrix_scan: R.Tensor((1, 1, 4, 2), dtype="float32") = R.call_pure_packed("scanweaver.matrix_scan", lv1_1, lv3_1, lv5, lv8, R.str("{\"batch\": 1, \"decay\": \"scalar\", \"dt_softplus\": false, \"dtype\": \"float32\", \"g_shape\": [1, 1, 4, 1], \"has_dt_bias\": false, \"has_gate\": false, \"has_h0\": false, \"has_skip\": false, \"heads\": 1, \"k_shape\": [1, 1, 4, 2], \"key\": 2, \"layout\": \"time_major\", \"length\": 4, \"q_shape\": [1, 1, 4, 2], \"return_last_state\": false, \"reverse\": false, \"v_shape\": [1, 1, 4, 2], \"value\": 2}"), ty_args=(R.Tensor((1, 1, 4, 2), dtype="float32"),))
                lv9: R.Tensor((4, 2, 1, 1), dtype="float32") = R.permute_dims(matrix_scan, axes=[2, 3, 0, 1])
                lv10: R.Tensor((1, 1, 4, 2), dtype="float32") = R.reshape(lv9, R.shape([1, 1, 4, 2]))
                lv129: R.Tensor((1, 4, 1, 2), dtype="float32") = R.permute_dims(lv10, axes=[0, 2, 1, 3])
                gv: R.Tuple(R.Tensor((1, 4, 1, 2), dtype="float32")) = (lv129,)
                R.output(gv)
            return gv

    _check(Before, Expected, "matrix")


def test_stabilized():
    """transformers' ``rwkv_linear_attention_cpu`` (RWKV-4's WKV): one max-stabilized scan.

    def wkv(w, u, key, value):
        from transformers.models.rwkv.modeling_rwkv import rwkv_linear_attention_cpu
        return rwkv_linear_attention_cpu(w, u, key, value)[0]

    w, u: (2,); key, value: (1, 3, 2)
    """
    @I.ir_module
    class Before:
        @R.function
        def main(args_0: R.Tensor((2,), dtype="float32"), args_1: R.Tensor((2,), dtype="float32"), args_2: R.Tensor((1, 3, 2), dtype="float32"), args_3: R.Tensor((1, 3, 2), dtype="float32")) -> R.Tuple(R.Tensor((1, 3, 2), dtype="float32")):
            with R.dataflow():
                lv: R.Tensor((1, 3, 2), dtype="float32") = R.full_like(args_2, R.const(0.0, "float32"), dtype=None)
                lv1: R.Tensor((1, 2), dtype="float32") = R.take(args_2, R.const(0, "int64"), axis=1, mode="clip")
                lv2: R.Tensor((1, 2), dtype="float32") = R.full_like(lv1, R.const(0.0, "float32"), dtype=None)
                lv3: R.Tensor((1, 2), dtype="float32") = R.take(args_2, R.const(0, "int64"), axis=1, mode="clip")
                lv4: R.Tensor((1, 2), dtype="float32") = R.full_like(lv3, R.const(0.0, "float32"), dtype=None)
                lv5: R.Tensor((1, 2), dtype="float32") = R.take(args_2, R.const(0, "int64"), axis=1, mode="clip")
                lv6: R.Tensor((1, 2), dtype="float32") = R.full_like(lv5, R.const(0.0, "float32"), dtype=None)
                lv7: R.Tensor((1, 2), dtype="float32") = R.subtract(lv6, R.const(99999996802856924650656260769173209088.0, "float32"))
                lv8: R.Tensor((2,), dtype="float32") = R.exp(args_0)
                lv9: R.Tensor((2,), dtype="float32") = R.negative(lv8)
                lv10: R.Tensor((1, 2), dtype="float32") = R.take(args_2, R.const(0, "int64"), axis=1, mode="clip")
                lv11: R.Tensor((1, 2), dtype="float32") = R.take(args_3, R.const(0, "int64"), axis=1, mode="clip")
                lv12: R.Tensor((1, 2), dtype="float32") = R.add(lv10, args_1)
                lv13: R.Tensor((1, 2), dtype="float32") = R.maximum(lv7, lv12)
                lv14: R.Tensor((1, 2), dtype="float32") = R.subtract(lv7, lv13)
                lv15: R.Tensor((1, 2), dtype="float32") = R.exp(lv14)
                lv16: R.Tensor((1, 2), dtype="float32") = R.add(lv10, args_1)
                lv17: R.Tensor((1, 2), dtype="float32") = R.subtract(lv16, lv13)
                lv18: R.Tensor((1, 2), dtype="float32") = R.exp(lv17)
                lv19: R.Tensor((1, 2), dtype="float32") = R.multiply(lv15, lv2)
                lv20: R.Tensor((1, 2), dtype="float32") = R.multiply(lv18, lv11)
                lv21: R.Tensor((1, 2), dtype="float32") = R.add(lv19, lv20)
                lv22: R.Tensor((1, 2), dtype="float32") = R.multiply(lv15, lv4)
                lv23: R.Tensor((1, 2), dtype="float32") = R.add(lv22, lv18)
                lv24: R.Tensor((1, 2), dtype="float32") = R.divide(lv21, lv23)
                lv25: R.Tensor((1, 2), dtype="float32") = R.take(lv, R.const(0, "int64"), axis=1, mode="clip")
                lv26: R.Tensor((1, 2), dtype="float32") = R.broadcast_to(lv24, R.shape([1, 2]))
                lv27: R.Tensor((3,), dtype="int64") = R.arange(0, 3, 1, dtype="int64")
                lv28: R.Tensor((1, 3, 1), dtype="int64") = R.reshape(lv27, R.shape([1, 3, 1]))
                lv29: R.Tensor((1, 3, 1), dtype="bool") = R.equal(lv28, R.const(0, "int64"))
                lv30: R.Tensor((1, 1, 2), dtype="float32") = R.expand_dims(lv26, axis=[1])
                lv31: R.Tensor((1, 3, 2), dtype="float32") = R.broadcast_to(lv30, R.shape([1, 3, 2]))
                lv32: R.Tensor((1, 3, 2), dtype="float32") = R.where(lv29, lv31, lv)
                lv33: R.Tensor((1, 2), dtype="float32") = R.add(lv7, lv9)
                lv34: R.Tensor((1, 2), dtype="float32") = R.maximum(lv33, lv10)
                lv35: R.Tensor((1, 2), dtype="float32") = R.add(lv7, lv9)
                lv36: R.Tensor((1, 2), dtype="float32") = R.subtract(lv35, lv34)
                lv37: R.Tensor((1, 2), dtype="float32") = R.exp(lv36)
                lv38: R.Tensor((1, 2), dtype="float32") = R.subtract(lv10, lv34)
                lv39: R.Tensor((1, 2), dtype="float32") = R.exp(lv38)
                lv40: R.Tensor((1, 2), dtype="float32") = R.multiply(lv37, lv2)
                lv41: R.Tensor((1, 2), dtype="float32") = R.multiply(lv39, lv11)
                lv42: R.Tensor((1, 2), dtype="float32") = R.add(lv40, lv41)
                lv43: R.Tensor((1, 2), dtype="float32") = R.multiply(lv37, lv4)
                lv44: R.Tensor((1, 2), dtype="float32") = R.add(lv43, lv39)
                lv45: R.Tensor((1, 2), dtype="float32") = R.take(args_2, R.const(1, "int64"), axis=1, mode="clip")
                lv46: R.Tensor((1, 2), dtype="float32") = R.take(args_3, R.const(1, "int64"), axis=1, mode="clip")
                lv47: R.Tensor((1, 2), dtype="float32") = R.add(lv45, args_1)
                lv48: R.Tensor((1, 2), dtype="float32") = R.maximum(lv34, lv47)
                lv49: R.Tensor((1, 2), dtype="float32") = R.subtract(lv34, lv48)
                lv50: R.Tensor((1, 2), dtype="float32") = R.exp(lv49)
                lv51: R.Tensor((1, 2), dtype="float32") = R.add(lv45, args_1)
                lv52: R.Tensor((1, 2), dtype="float32") = R.subtract(lv51, lv48)
                lv53: R.Tensor((1, 2), dtype="float32") = R.exp(lv52)
                lv54: R.Tensor((1, 2), dtype="float32") = R.multiply(lv50, lv42)
                lv55: R.Tensor((1, 2), dtype="float32") = R.multiply(lv53, lv46)
                lv56: R.Tensor((1, 2), dtype="float32") = R.add(lv54, lv55)
                lv57: R.Tensor((1, 2), dtype="float32") = R.multiply(lv50, lv44)
                lv58: R.Tensor((1, 2), dtype="float32") = R.add(lv57, lv53)
                lv59: R.Tensor((1, 2), dtype="float32") = R.divide(lv56, lv58)
                lv60: R.Tensor((1, 2), dtype="float32") = R.take(lv32, R.const(1, "int64"), axis=1, mode="clip")
                lv61: R.Tensor((1, 2), dtype="float32") = R.broadcast_to(lv59, R.shape([1, 2]))
                lv62: R.Tensor((3,), dtype="int64") = R.arange(0, 3, 1, dtype="int64")
                lv63: R.Tensor((1, 3, 1), dtype="int64") = R.reshape(lv62, R.shape([1, 3, 1]))
                lv64: R.Tensor((1, 3, 1), dtype="bool") = R.equal(lv63, R.const(1, "int64"))
                lv65: R.Tensor((1, 1, 2), dtype="float32") = R.expand_dims(lv61, axis=[1])
                lv66: R.Tensor((1, 3, 2), dtype="float32") = R.broadcast_to(lv65, R.shape([1, 3, 2]))
                lv67: R.Tensor((1, 3, 2), dtype="float32") = R.where(lv64, lv66, lv32)
                lv68: R.Tensor((1, 2), dtype="float32") = R.add(lv34, lv9)
                lv69: R.Tensor((1, 2), dtype="float32") = R.maximum(lv68, lv45)
                lv70: R.Tensor((1, 2), dtype="float32") = R.add(lv34, lv9)
                lv71: R.Tensor((1, 2), dtype="float32") = R.subtract(lv70, lv69)
                lv72: R.Tensor((1, 2), dtype="float32") = R.exp(lv71)
                lv73: R.Tensor((1, 2), dtype="float32") = R.subtract(lv45, lv69)
                lv74: R.Tensor((1, 2), dtype="float32") = R.exp(lv73)
                lv75: R.Tensor((1, 2), dtype="float32") = R.multiply(lv72, lv42)
                lv76: R.Tensor((1, 2), dtype="float32") = R.multiply(lv74, lv46)
                lv77: R.Tensor((1, 2), dtype="float32") = R.add(lv75, lv76)
                lv78: R.Tensor((1, 2), dtype="float32") = R.multiply(lv72, lv44)
                lv79: R.Tensor((1, 2), dtype="float32") = R.add(lv78, lv74)
                lv80: R.Tensor((1, 2), dtype="float32") = R.take(args_2, R.const(2, "int64"), axis=1, mode="clip")
                lv81: R.Tensor((1, 2), dtype="float32") = R.take(args_3, R.const(2, "int64"), axis=1, mode="clip")
                lv82: R.Tensor((1, 2), dtype="float32") = R.add(lv80, args_1)
                lv83: R.Tensor((1, 2), dtype="float32") = R.maximum(lv69, lv82)
                lv84: R.Tensor((1, 2), dtype="float32") = R.subtract(lv69, lv83)
                lv85: R.Tensor((1, 2), dtype="float32") = R.exp(lv84)
                lv86: R.Tensor((1, 2), dtype="float32") = R.add(lv80, args_1)
                lv87: R.Tensor((1, 2), dtype="float32") = R.subtract(lv86, lv83)
                lv88: R.Tensor((1, 2), dtype="float32") = R.exp(lv87)
                lv89: R.Tensor((1, 2), dtype="float32") = R.multiply(lv85, lv77)
                lv90: R.Tensor((1, 2), dtype="float32") = R.multiply(lv88, lv81)
                lv91: R.Tensor((1, 2), dtype="float32") = R.add(lv89, lv90)
                lv92: R.Tensor((1, 2), dtype="float32") = R.multiply(lv85, lv79)
                lv93: R.Tensor((1, 2), dtype="float32") = R.add(lv92, lv88)
                lv94: R.Tensor((1, 2), dtype="float32") = R.divide(lv91, lv93)
                lv95: R.Tensor((1, 2), dtype="float32") = R.take(lv67, R.const(2, "int64"), axis=1, mode="clip")
                lv96: R.Tensor((1, 2), dtype="float32") = R.broadcast_to(lv94, R.shape([1, 2]))
                lv97: R.Tensor((3,), dtype="int64") = R.arange(0, 3, 1, dtype="int64")
                lv98: R.Tensor((1, 3, 1), dtype="int64") = R.reshape(lv97, R.shape([1, 3, 1]))
                lv99: R.Tensor((1, 3, 1), dtype="bool") = R.equal(lv98, R.const(2, "int64"))
                lv100: R.Tensor((1, 1, 2), dtype="float32") = R.expand_dims(lv96, axis=[1])
                lv101: R.Tensor((1, 3, 2), dtype="float32") = R.broadcast_to(lv100, R.shape([1, 3, 2]))
                lv102: R.Tensor((1, 3, 2), dtype="float32") = R.where(lv99, lv101, lv67)
                gv: R.Tuple(R.Tensor((1, 3, 2), dtype="float32")) = (lv102,)
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function
        def main(args_0: R.Tensor((2,), dtype="float32"), args_1: R.Tensor((2,), dtype="float32"), args_2: R.Tensor((1, 3, 2), dtype="float32"), args_3: R.Tensor((1, 3, 2), dtype="float32")) -> R.Tuple(R.Tensor((1, 3, 2), dtype="float32")):
            with R.dataflow():
                lv1: R.Tensor((1, 2), dtype="float32") = R.take(args_2, R.const(0, "int64"), axis=1, mode="clip")
                lv2: R.Tensor((1, 2), dtype="float32") = R.full_like(lv1, R.const(0.0, "float32"), dtype=None)
                lv3: R.Tensor((1, 2), dtype="float32") = R.take(args_2, R.const(0, "int64"), axis=1, mode="clip")
                lv4: R.Tensor((1, 2), dtype="float32") = R.full_like(lv3, R.const(0.0, "float32"), dtype=None)
                lv5: R.Tensor((1, 2), dtype="float32") = R.take(args_2, R.const(0, "int64"), axis=1, mode="clip")
                lv6: R.Tensor((1, 2), dtype="float32") = R.full_like(lv5, R.const(0.0, "float32"), dtype=None)
                lv7: R.Tensor((1, 2), dtype="float32") = R.subtract(lv6, R.const(99999996802856924650656260769173209088.0, "float32"))
                lv8: R.Tensor((2,), dtype="float32") = R.exp(args_0)
                lv9: R.Tensor((2,), dtype="float32") = R.negative(lv8)
                lv: R.Tensor((1, 3, 2), dtype="float32") = R.call_pure_packed("scanweaver.stabilized_scan", args_2, args_3, lv9, args_1, lv2, lv4, lv7, R.str("{\"batch\": 1, \"channels\": 2, \"decay\": \"channel\", \"dtype\": \"float32\", \"has_bonus\": true, \"has_h0\": true, \"has_values\": true, \"layout\": \"time_major\", \"length\": 3, \"return_last_state\": false, \"reverse\": false}"), ty_args=(R.Tensor((1, 3, 2), dtype="float32"),))
                gv: R.Tuple(R.Tensor((1, 3, 2), dtype="float32")) = (lv,)
                R.output(gv)
            return gv

    _check(Before, Expected, "stabilized")


def test_mlstm():
    """An mLSTM loop (max-stabilized gates, matrix state): one mLSTM scan.

    def mlstm(q, k, v, i_gate, f_gate):
        b, h, length, dk = q.shape
        state = torch.zeros(b, h, dk, v.shape[-1]); m = torch.zeros(b, h); outs = []
        for t in range(length):
            f = F.logsigmoid(f_gate[:, :, t])
            m_new = torch.maximum(f + m, i_gate[:, :, t])
            decay = torch.exp(f + m - m_new)[..., None, None]
            state = decay * state + torch.exp(i_gate[:, :, t] - m_new)[..., None, None] * (
                k[:, :, t, :, None] * v[:, :, t, None, :])
            m = m_new
            outs.append((q[:, :, t, :, None] * state).sum(-2))
        return torch.stack(outs, dim=2)

    q, k: (1, 1, 2, 3); v: (1, 1, 2, 2); gates: (1, 1, 2)
    """
    @I.ir_module
    class Before:
        @R.function
        def main(args_0: R.Tensor((1, 1, 2, 3), dtype="float32"), args_1: R.Tensor((1, 1, 2, 3), dtype="float32"), args_2: R.Tensor((1, 1, 2, 2), dtype="float32"), args_3: R.Tensor((1, 1, 2), dtype="float32"), args_4: R.Tensor((1, 1, 2), dtype="float32")) -> R.Tuple(R.Tensor((1, 1, 2, 2), dtype="float32")):
            with R.dataflow():
                lv: R.Tensor((1, 1, 3, 2), dtype="float32") = R.full(R.shape([1, 1, 3, 2]), R.const(0.0, "float32"), dtype="float32")
                lv1: R.Tensor((1, 1), dtype="float32") = R.full(R.shape([1, 1]), R.const(0.0, "float32"), dtype="float32")
                lv2: R.Tensor((1, 1), dtype="float32") = R.take(args_4, R.const(0, "int64"), axis=2, mode="clip")
                lv3: R.Tensor((), dtype="float32") = R.full(R.shape([]), R.const(0.0, "float32"), dtype="float32")
                lv4: R.Tensor((1, 1), dtype="float32") = R.minimum(lv3, lv2)
                lv5: R.Tensor((1, 1), dtype="float32") = R.abs(lv2)
                lv6: R.Tensor((1, 1), dtype="float32") = R.negative(lv5)
                lv7: R.Tensor((1, 1), dtype="float32") = R.exp(lv6)
                lv8: R.Tensor((1, 1), dtype="float32") = R.add(lv7, R.const(1.0, "float32"))
                lv9: R.Tensor((1, 1), dtype="float32") = R.log(lv8)
                lv10: R.Tensor((1, 1), dtype="float32") = R.subtract(lv4, lv9)
                lv11: R.Tensor((1, 1), dtype="float32") = R.add(lv10, lv1)
                lv12: R.Tensor((1, 1), dtype="float32") = R.take(args_3, R.const(0, "int64"), axis=2, mode="clip")
                lv13: R.Tensor((1, 1), dtype="float32") = R.maximum(lv11, lv12)
                lv14: R.Tensor((1, 1), dtype="float32") = R.add(lv10, lv1)
                lv15: R.Tensor((1, 1), dtype="float32") = R.subtract(lv14, lv13)
                lv16: R.Tensor((1, 1), dtype="float32") = R.exp(lv15)
                lv17: R.Tensor((1, 1, 1), dtype="float32") = R.expand_dims(lv16, axis=[2])
                lv18: R.Tensor((1, 1, 1, 1), dtype="float32") = R.expand_dims(lv17, axis=[3])
                lv19: R.Tensor((1, 1, 3, 2), dtype="float32") = R.multiply(lv18, lv)
                lv20: R.Tensor((1, 1), dtype="float32") = R.take(args_3, R.const(0, "int64"), axis=2, mode="clip")
                lv21: R.Tensor((1, 1), dtype="float32") = R.subtract(lv20, lv13)
                lv22: R.Tensor((1, 1), dtype="float32") = R.exp(lv21)
                lv23: R.Tensor((1, 1, 1), dtype="float32") = R.expand_dims(lv22, axis=[2])
                lv24: R.Tensor((1, 1, 1, 1), dtype="float32") = R.expand_dims(lv23, axis=[3])
                lv25: R.Tensor((1, 1, 3), dtype="float32") = R.take(args_1, R.const(0, "int64"), axis=2, mode="clip")
                lv26: R.Tensor((1, 1, 3, 1), dtype="float32") = R.expand_dims(lv25, axis=[3])
                lv27: R.Tensor((1, 1, 2), dtype="float32") = R.take(args_2, R.const(0, "int64"), axis=2, mode="clip")
                lv28: R.Tensor((1, 1, 1, 2), dtype="float32") = R.expand_dims(lv27, axis=[2])
                lv29: R.Tensor((1, 1, 3, 2), dtype="float32") = R.multiply(lv26, lv28)
                lv30: R.Tensor((1, 1, 3, 2), dtype="float32") = R.multiply(lv24, lv29)
                lv31: R.Tensor((1, 1, 3, 2), dtype="float32") = R.add(lv19, lv30)
                lv32: R.Tensor((1, 1, 3), dtype="float32") = R.take(args_0, R.const(0, "int64"), axis=2, mode="clip")
                lv33: R.Tensor((1, 1, 3, 1), dtype="float32") = R.expand_dims(lv32, axis=[3])
                lv34: R.Tensor((1, 1, 3, 2), dtype="float32") = R.multiply(lv33, lv31)
                lv35: R.Tensor((1, 1, 2), dtype="float32") = R.sum(lv34, axis=[-2], keepdims=False)
                lv36: R.Tensor((1, 1), dtype="float32") = R.take(args_4, R.const(1, "int64"), axis=2, mode="clip")
                lv37: R.Tensor((), dtype="float32") = R.full(R.shape([]), R.const(0.0, "float32"), dtype="float32")
                lv38: R.Tensor((1, 1), dtype="float32") = R.minimum(lv37, lv36)
                lv39: R.Tensor((1, 1), dtype="float32") = R.abs(lv36)
                lv40: R.Tensor((1, 1), dtype="float32") = R.negative(lv39)
                lv41: R.Tensor((1, 1), dtype="float32") = R.exp(lv40)
                lv42: R.Tensor((1, 1), dtype="float32") = R.add(lv41, R.const(1.0, "float32"))
                lv43: R.Tensor((1, 1), dtype="float32") = R.log(lv42)
                lv44: R.Tensor((1, 1), dtype="float32") = R.subtract(lv38, lv43)
                lv45: R.Tensor((1, 1), dtype="float32") = R.add(lv44, lv13)
                lv46: R.Tensor((1, 1), dtype="float32") = R.take(args_3, R.const(1, "int64"), axis=2, mode="clip")
                lv47: R.Tensor((1, 1), dtype="float32") = R.maximum(lv45, lv46)
                lv48: R.Tensor((1, 1), dtype="float32") = R.add(lv44, lv13)
                lv49: R.Tensor((1, 1), dtype="float32") = R.subtract(lv48, lv47)
                lv50: R.Tensor((1, 1), dtype="float32") = R.exp(lv49)
                lv51: R.Tensor((1, 1, 1), dtype="float32") = R.expand_dims(lv50, axis=[2])
                lv52: R.Tensor((1, 1, 1, 1), dtype="float32") = R.expand_dims(lv51, axis=[3])
                lv53: R.Tensor((1, 1, 3, 2), dtype="float32") = R.multiply(lv52, lv31)
                lv54: R.Tensor((1, 1), dtype="float32") = R.take(args_3, R.const(1, "int64"), axis=2, mode="clip")
                lv55: R.Tensor((1, 1), dtype="float32") = R.subtract(lv54, lv47)
                lv56: R.Tensor((1, 1), dtype="float32") = R.exp(lv55)
                lv57: R.Tensor((1, 1, 1), dtype="float32") = R.expand_dims(lv56, axis=[2])
                lv58: R.Tensor((1, 1, 1, 1), dtype="float32") = R.expand_dims(lv57, axis=[3])
                lv59: R.Tensor((1, 1, 3), dtype="float32") = R.take(args_1, R.const(1, "int64"), axis=2, mode="clip")
                lv60: R.Tensor((1, 1, 3, 1), dtype="float32") = R.expand_dims(lv59, axis=[3])
                lv61: R.Tensor((1, 1, 2), dtype="float32") = R.take(args_2, R.const(1, "int64"), axis=2, mode="clip")
                lv62: R.Tensor((1, 1, 1, 2), dtype="float32") = R.expand_dims(lv61, axis=[2])
                lv63: R.Tensor((1, 1, 3, 2), dtype="float32") = R.multiply(lv60, lv62)
                lv64: R.Tensor((1, 1, 3, 2), dtype="float32") = R.multiply(lv58, lv63)
                lv65: R.Tensor((1, 1, 3, 2), dtype="float32") = R.add(lv53, lv64)
                lv66: R.Tensor((1, 1, 3), dtype="float32") = R.take(args_0, R.const(1, "int64"), axis=2, mode="clip")
                lv67: R.Tensor((1, 1, 3, 1), dtype="float32") = R.expand_dims(lv66, axis=[3])
                lv68: R.Tensor((1, 1, 3, 2), dtype="float32") = R.multiply(lv67, lv65)
                lv69: R.Tensor((1, 1, 2), dtype="float32") = R.sum(lv68, axis=[-2], keepdims=False)
                lv70: R.Tensor((1, 1, 4), dtype="float32") = R.concat((lv35, lv69), axis=2)
                lv71: R.Tensor((1, 1, 2, 2), dtype="float32") = R.reshape(lv70, R.shape([1, 1, 2, 2]))
                gv: R.Tuple(R.Tensor((1, 1, 2, 2), dtype="float32")) = (lv71,)
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function
        def main(args_0: R.Tensor((1, 1, 2, 3), dtype="float32"), args_1: R.Tensor((1, 1, 2, 3), dtype="float32"), args_2: R.Tensor((1, 1, 2, 2), dtype="float32"), args_3: R.Tensor((1, 1, 2), dtype="float32"), args_4: R.Tensor((1, 1, 2), dtype="float32")) -> R.Tuple(R.Tensor((1, 1, 2, 2), dtype="float32")):
            with R.dataflow():
                lv: R.Tensor((1, 1, 3, 2), dtype="float32") = R.full(R.shape([1, 1, 3, 2]), R.const(0.0, "float32"), dtype="float32")
                lv1: R.Tensor((1, 1), dtype="float32") = R.full(R.shape([1, 1]), R.const(0.0, "float32"), dtype="float32")
                lv3: R.Tensor((), dtype="float32") = R.full(R.shape([]), R.const(0.0, "float32"), dtype="float32")
                lv_1: R.Tensor((1, 1, 2), dtype="float32") = R.minimum(lv3, args_4)
                lv1_1: R.Tensor((1, 1, 2), dtype="float32") = R.abs(args_4)
                lv2: R.Tensor((1, 1, 2), dtype="float32") = R.negative(lv1_1)
                lv3_1: R.Tensor((1, 1, 2), dtype="float32") = R.exp(lv2)
                lv4: R.Tensor((1, 1, 2), dtype="float32") = R.add(lv3_1, R.const(1.0, "float32"))
                lv5: R.Tensor((1, 1, 2), dtype="float32") = R.log(lv4)
                lv6: R.Tensor((1, 1, 2), dtype="float32") = R.subtract(lv_1, lv5)
                lv7: R.Tensor((1, 1, 2, 2), dtype="float32") = R.call_pure_packed("scanweaver.mlstm_scan", args_0, args_1, args_2, args_3, lv6, lv, lv1, R.str("{\"batch\": 1, \"dtype\": \"float32\", \"eps\": 0.0, \"has_h0\": true, \"heads\": 1, \"key\": 3, \"length\": 2, \"normalized\": false, \"return_last_state\": false, \"reverse\": false, \"value\": 2}"), ty_args=(R.Tensor((1, 1, 2, 2), dtype="float32"),))
                lv8: R.Tensor((1, 1, 4), dtype="float32") = R.reshape(lv7, R.shape([1, 1, 4]))
                lv71: R.Tensor((1, 1, 2, 2), dtype="float32") = R.reshape(lv8, R.shape([1, 1, 2, 2]))
                gv: R.Tuple(R.Tensor((1, 1, 2, 2), dtype="float32")) = (lv71,)
                R.output(gv)
            return gv

    _check(Before, Expected, "mlstm")


def test_delta():
    """A delta-rule loop (S += k (beta (v - S^T k))^T): one delta scan.

    def delta(q, k, v, beta):                # plain delta rule, (B, H, L, .)
        b, h, l, dk = q.shape
        S = torch.zeros(b, h, dk, v.shape[-1]); outs = []
        for t in range(l):
            k_t, v_t, b_t = k[:, :, t], v[:, :, t], beta[:, :, t]
            v_new = (v_t - (S * k_t[..., None]).sum(-2)) * b_t[..., None]
            S = S + k_t[..., None] * v_new[..., None, :]
            outs.append((q[:, :, t][..., None] * S).sum(-2))
        return torch.stack(outs, dim=2)

    q, k: (1, 1, 2, 3); v: (1, 1, 2, 2); beta: (1, 1, 2)
    """
    @I.ir_module
    class Before:
        @R.function
        def main(args_0: R.Tensor((1, 1, 2, 3), dtype="float32"), args_1: R.Tensor((1, 1, 2, 3), dtype="float32"), args_2: R.Tensor((1, 1, 2, 2), dtype="float32"), args_3: R.Tensor((1, 1, 2), dtype="float32")) -> R.Tuple(R.Tensor((1, 1, 2, 2), dtype="float32")):
            with R.dataflow():
                lv: R.Tensor((1, 1, 3, 2), dtype="float32") = R.full(R.shape([1, 1, 3, 2]), R.const(0.0, "float32"), dtype="float32")
                lv1: R.Tensor((1, 1, 3), dtype="float32") = R.take(args_1, R.const(0, "int64"), axis=2, mode="clip")
                lv2: R.Tensor((1, 1, 2), dtype="float32") = R.take(args_2, R.const(0, "int64"), axis=2, mode="clip")
                lv3: R.Tensor((1, 1), dtype="float32") = R.take(args_3, R.const(0, "int64"), axis=2, mode="clip")
                lv4: R.Tensor((1, 1, 3, 1), dtype="float32") = R.expand_dims(lv1, axis=[3])
                lv5: R.Tensor((1, 1, 3, 2), dtype="float32") = R.multiply(lv, lv4)
                lv6: R.Tensor((1, 1, 2), dtype="float32") = R.sum(lv5, axis=[-2], keepdims=False)
                lv7: R.Tensor((1, 1, 2), dtype="float32") = R.subtract(lv2, lv6)
                lv8: R.Tensor((1, 1, 1), dtype="float32") = R.expand_dims(lv3, axis=[2])
                lv9: R.Tensor((1, 1, 2), dtype="float32") = R.multiply(lv7, lv8)
                lv10: R.Tensor((1, 1, 3, 1), dtype="float32") = R.expand_dims(lv1, axis=[3])
                lv11: R.Tensor((1, 1, 1, 2), dtype="float32") = R.expand_dims(lv9, axis=[2])
                lv12: R.Tensor((1, 1, 3, 2), dtype="float32") = R.multiply(lv10, lv11)
                lv13: R.Tensor((1, 1, 3, 2), dtype="float32") = R.add(lv, lv12)
                lv14: R.Tensor((1, 1, 3), dtype="float32") = R.take(args_0, R.const(0, "int64"), axis=2, mode="clip")
                lv15: R.Tensor((1, 1, 3, 1), dtype="float32") = R.expand_dims(lv14, axis=[3])
                lv16: R.Tensor((1, 1, 3, 2), dtype="float32") = R.multiply(lv15, lv13)
                lv17: R.Tensor((1, 1, 2), dtype="float32") = R.sum(lv16, axis=[-2], keepdims=False)
                lv18: R.Tensor((1, 1, 3), dtype="float32") = R.take(args_1, R.const(1, "int64"), axis=2, mode="clip")
                lv19: R.Tensor((1, 1, 2), dtype="float32") = R.take(args_2, R.const(1, "int64"), axis=2, mode="clip")
                lv20: R.Tensor((1, 1), dtype="float32") = R.take(args_3, R.const(1, "int64"), axis=2, mode="clip")
                lv21: R.Tensor((1, 1, 3, 1), dtype="float32") = R.expand_dims(lv18, axis=[3])
                lv22: R.Tensor((1, 1, 3, 2), dtype="float32") = R.multiply(lv13, lv21)
                lv23: R.Tensor((1, 1, 2), dtype="float32") = R.sum(lv22, axis=[-2], keepdims=False)
                lv24: R.Tensor((1, 1, 2), dtype="float32") = R.subtract(lv19, lv23)
                lv25: R.Tensor((1, 1, 1), dtype="float32") = R.expand_dims(lv20, axis=[2])
                lv26: R.Tensor((1, 1, 2), dtype="float32") = R.multiply(lv24, lv25)
                lv27: R.Tensor((1, 1, 3, 1), dtype="float32") = R.expand_dims(lv18, axis=[3])
                lv28: R.Tensor((1, 1, 1, 2), dtype="float32") = R.expand_dims(lv26, axis=[2])
                lv29: R.Tensor((1, 1, 3, 2), dtype="float32") = R.multiply(lv27, lv28)
                lv30: R.Tensor((1, 1, 3, 2), dtype="float32") = R.add(lv13, lv29)
                lv31: R.Tensor((1, 1, 3), dtype="float32") = R.take(args_0, R.const(1, "int64"), axis=2, mode="clip")
                lv32: R.Tensor((1, 1, 3, 1), dtype="float32") = R.expand_dims(lv31, axis=[3])
                lv33: R.Tensor((1, 1, 3, 2), dtype="float32") = R.multiply(lv32, lv30)
                lv34: R.Tensor((1, 1, 2), dtype="float32") = R.sum(lv33, axis=[-2], keepdims=False)
                lv35: R.Tensor((1, 1, 4), dtype="float32") = R.concat((lv17, lv34), axis=2)
                lv36: R.Tensor((1, 1, 2, 2), dtype="float32") = R.reshape(lv35, R.shape([1, 1, 2, 2]))
                gv: R.Tuple(R.Tensor((1, 1, 2, 2), dtype="float32")) = (lv36,)
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function
        def main(args_0: R.Tensor((1, 1, 2, 3), dtype="float32"), args_1: R.Tensor((1, 1, 2, 3), dtype="float32"), args_2: R.Tensor((1, 1, 2, 2), dtype="float32"), args_3: R.Tensor((1, 1, 2), dtype="float32")) -> R.Tuple(R.Tensor((1, 1, 2, 2), dtype="float32")):
            with R.dataflow():
                lv: R.Tensor((1, 1, 3, 2), dtype="float32") = R.full(R.shape([1, 1, 3, 2]), R.const(0.0, "float32"), dtype="float32")
                lv_1: R.Tensor((2, 1, 1, 3), dtype="float32") = R.permute_dims(args_0, axes=[2, 0, 1, 3])
                lv1: R.Tensor((2, 1, 1, 3, 1), dtype="float32") = R.expand_dims(lv_1, axis=[4])
                lv2: R.Tensor((1, 1, 2, 3, 1), dtype="float32") = R.permute_dims(lv1, axes=[1, 2, 0, 3, 4])
                lv3: R.Tensor((1, 1, 2, 3), dtype="float32") = R.reshape(lv2, R.shape([1, 1, 2, 3]))
                lv4: R.Tensor((2, 1, 1, 3), dtype="float32") = R.permute_dims(args_1, axes=[2, 0, 1, 3])
                lv5: R.Tensor((2, 1, 1, 3, 1), dtype="float32") = R.expand_dims(lv4, axis=[4])
                lv6: R.Tensor((1, 1, 2, 3, 1), dtype="float32") = R.permute_dims(lv5, axes=[1, 2, 0, 3, 4])
                lv7: R.Tensor((1, 1, 2, 3), dtype="float32") = R.reshape(lv6, R.shape([1, 1, 2, 3]))
                lv8: R.Tensor((2, 1, 1), dtype="float32") = R.permute_dims(args_3, axes=[2, 0, 1])
                lv9: R.Tensor((2, 1, 1, 1), dtype="float32") = R.expand_dims(lv8, axis=[3])
                lv10: R.Tensor((1, 1, 2, 1), dtype="float32") = R.permute_dims(lv9, axes=[1, 2, 0, 3])
                lv11: R.Tensor((1, 1, 2), dtype="float32") = R.reshape(lv10, R.shape([1, 1, 2]))
                lv12: R.Tensor((1, 1, 2, 2), dtype="float32") = R.call_pure_packed("scanweaver.delta_scan", lv3, lv7, args_2, lv11, lv, R.str("{\"batch\": 1, \"decay\": \"none\", \"dtype\": \"float32\", \"has_h0\": true, \"heads\": 1, \"key\": 3, \"l2norm\": false, \"length\": 2, \"qk_heads\": 1, \"return_last_state\": false, \"reverse\": false, \"rule\": \"delta\", \"scale\": 1.0, \"separate_read\": false, \"value\": 2}"), ty_args=(R.Tensor((1, 1, 2, 2), dtype="float32"),))
                lv13: R.Tensor((1, 1, 4), dtype="float32") = R.reshape(lv12, R.shape([1, 1, 4]))
                lv36: R.Tensor((1, 1, 2, 2), dtype="float32") = R.reshape(lv13, R.shape([1, 1, 2, 2]))
                gv: R.Tuple(R.Tensor((1, 1, 2, 2), dtype="float32")) = (lv36,)
                R.output(gv)
            return gv

    _check(Before, Expected, "delta")
