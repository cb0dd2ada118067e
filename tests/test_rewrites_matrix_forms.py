"""``Before``/``Expected`` rewrites (``rewrite_check`` says how they are pinned) of the forms that
become a matrix scan: a GLA loop with a (K, V) state, and fla's chunked simple GLA (a chunked
region, padded, with in-place writes)."""
from tvm.script import ir as I
from tvm.script import relax as R

from rewrite_check import _check


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
