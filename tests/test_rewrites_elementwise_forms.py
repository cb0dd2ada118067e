"""``Before``/``Expected`` rewrites (``rewrite_check`` says how they are pinned) of the forms
whose state is updated elementwise: a plain affine chain, Mamba's selective scan and RWKV-4's
max-stabilized WKV."""
from tvm.script import ir as I
from tvm.script import relax as R

from rewrite_check import _check


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
