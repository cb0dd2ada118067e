"""``Before``/``Expected`` rewrites (``rewrite_check`` says how they are pinned) of the matrix-state
forms beyond the matrix scan: an mLSTM loop (max-stabilized gates) and a delta-rule loop."""
from tvm.script import ir as I
from tvm.script import relax as R

from rewrite_check import _check


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
