"""Weight-only quantization of the dense layers, asked for at compile time (``weights="int8"``,
``"int4"``, ...: ``scanweaver_core.weight_formats`` names them).

Decode is bound by the bytes of the weights it streams; CPU users run models with their weights
quantized (llama.cpp's Q8_0 / Q4_0, OpenVINO's NNCF ``INT8_ASYM`` / ``INT4_SYM``, MLC's
``q4f16_1``).  ``QuantizeWeights`` rewrites each dense layer whose weight is a constant,
``matmul(x, W)`` with W (K x N) float, quantized once here from the model's own weights:

- ``int8`` (symmetric, per output channel): ``matmul(x, Wq, out_dtype="float32") * scale``,
  ``Wq`` int8; ``dense_cpu`` packs it and widens it in registers.
- every other format: one kernel over the weight packed in panels (``QuantizedWeight.packed``),
  ``x @ (q * scale + low)``: ``dequantize_matmul``, whose dequantization ``dense_cpu`` computes
  once a panel of columns, or inside the register tile for one row tile (the float weight is
  never written out whole), or, for a decode step's few rows, ``dequantize_gemv``, which sums
  group by group (``dequantize_gemv_cpu``).  Columns are padded to whole panels and sliced back.
- a format that asks for bf16 activations (``weight_format(.., activations="bfloat16")``), on a
  target with AVX512-BF16: a prefill's layers (int8 too) are ``dequantize_matmul_bf16``, whose
  weight ``dense_cpu`` dequantizes a panel at a time to bf16 pairs for ``vdpbf16ps``.

(then cast back to the layer's dtype).  The model's precision changes because the user asked;
the report says which layers changed and to what.  A weight read as ``permute_dims`` of a
constant (how ``nn.Linear`` imports before constant folding) is taken too.  The layer that
produces the logits (its weight shaped as an embedding table the function ``take``s from,
transposed) takes the format's ``head`` format.  Embeddings (``take``) keep their precision: a token
reads one row of them.
"""
import logging
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax, te
from tvm.ir.expr import GenericConst

from scanweaver_core.weight_formats import GEMV_ROWS, PANEL, weight_format
from tir_schedules import bf16_dot

LOG = logging.getLogger("scanweaver")

MIN_SIDE = 16       # a smaller constant matrix is left as it is (a model's fixed mixing, not a layer)
FLOATS = ("float32", "float16", "bfloat16")


@dataclass
class QuantizeReport:
    """What ``QuantizeWeights`` changed: one ``(K, N)`` per weight quantized and its format's
    name, and the bytes of those weights before and after (scales included)."""
    weights: list = field(default_factory=list)
    formats: list = field(default_factory=list)
    bytes_before: int = 0
    bytes_after: int = 0
    bf16_activations: int = 0      # layers whose prefill rounds its activations to bf16 (asked for)


def dequantize_matmul(x, packed, scale, low, group, bits):
    """``x @ W`` (float32) with ``W[k, j] = q[k, j] * scale[k // group, j] + low[k // group, j]``
    and ``q`` read from its panels (``QuantizedWeight.packed``): a TE compute of two stages, the
    dequantization (which ``dense_cpu`` computes a panel at a time, or in its register tile) and
    the matmul."""
    *lead, depth = x.shape
    q = _stored(packed, bits)
    w = te.compute((depth, _columns(packed)),
                   lambda k, j: q(k, j) * scale[k // group, j] + low[k // group, j], name="dequantize")
    k = te.reduce_axis((0, depth), "k")
    return te.compute((*lead, _columns(packed)),
                      lambda *i: te.sum(x[(*i[:-1], k)].astype("float32") * w[k, i[-1]], axis=k), name="matmul")


def dequantize_matmul_bf16(x, packed, scale, low, group, bits):
    """``dequantize_matmul``'s product with both operands rounded to bf16 (float32 sums): a
    prefill's GEMM on a CPU with AVX512-BF16, where ``dense_cpu`` dequantizes each panel of the
    weight once, to bf16 pairs, and multiplies with ``vdpbf16ps`` (twice an FMA's products)."""
    *lead, depth = x.shape
    q = _stored(packed, bits)
    rounded = te.compute(x.shape, lambda *i: x[i].astype("bfloat16"), name="activations_bf16")
    w = te.compute((depth, _columns(packed)),
                   lambda k, j: (q(k, j) * scale[k // group, j] + low[k // group, j]).astype("bfloat16"),
                   name="dequantize")
    k = te.reduce_axis((0, depth), "k")
    return te.compute((*lead, _columns(packed)),
                      lambda *i: te.sum(rounded[(*i[:-1], k)].astype("float32") * w[k, i[-1]].astype("float32"),
                                        axis=k), name="matmul")


def dequantize_gemv(x, packed, scale, low, group, bits):
    """``dequantize_matmul``'s product for a few rows (decode), summed group by group:
    ``sum_g scale[g] * (x_g @ q_g) + low[g] * sum(x_g)``.  Each weight is
    widened and multiplied once; the scale and low are applied once a group, not once a weight
    (a GEMV of int4 weights is bound by that arithmetic, not by its bytes).  Stages: ``partial``
    (each group's integer product), ``xsum`` (each group's sum of ``x``) and ``matmul``, which
    ``dequantize_gemv_cpu`` schedules as one tile per few panels.  K is whole groups
    (``_whole_groups``: TVM 0.27's ``create_prim_func`` drops a reduction's ``where``, so a short
    last group cannot be expressed)."""
    *lead, depth = x.shape
    groups, group = int(scale.shape[0]), min(group, int(depth))
    q, kk = _stored(packed, bits), te.reduce_axis((0, group), "kk")

    def k(g):
        return g * group + kk

    partial = te.compute((*lead, groups, _columns(packed)),
                         lambda *i: te.sum(x[(*i[:-2], k(i[-2]))].astype("float32") * q(k(i[-2]), i[-1]), axis=kk),
                         name="partial")
    xsum = te.compute((*lead, groups), lambda *i: te.sum(x[(*i[:-1], k(i[-1]))].astype("float32"), axis=kk),
                      name="xsum")
    g = te.reduce_axis((0, groups), "g")
    return te.compute((*lead, _columns(packed)),
                      lambda *i: te.sum(partial[(*i[:-1], g, i[-1])] * scale[g, i[-1]]
                                        + xsum[(*i[:-1], g)] * low[g, i[-1]], axis=g), name="matmul")


def _columns(packed):
    return packed.shape[0] * PANEL


def _stored(packed, bits):
    """``q(k, j)``: the integer stored for ``W[k, j]`` in its panel, as float32."""
    half = PANEL // 2

    def q(k, j):
        if bits == 8:
            return packed[j // PANEL, k, j % PANEL].astype("float32")
        byte = packed[j // PANEL, k, j % half]
        return ((byte >> ((j % PANEL) // half * 4).astype("uint8")) & tvm.tirx.const(15, "uint8")).astype("float32")

    return q


def _constant_weight(expr, lookup):
    """The (K, N) float32 numpy array ``expr`` holds (a float constant, or ``permute_dims`` of
    one, either maybe broadcast to (1, K, N) and bound to a variable: ``lookup``), or None."""
    permuted, axes = False, None
    expr = _bound(expr, lookup)
    if _call_of(expr, "relax.broadcast_to", "relax.reshape", "relax.expand_dims") and _leading_ones(expr.ty):
        expr = _bound(expr.args[0], lookup)        # (1, K, N) of a (K, N) weight: a batched matmul's
    if _call_of(expr, "relax.permute_dims"):
        permuted = True
        axes = [int(a) for a in expr.attrs.axes] if expr.attrs.axes is not None else None
        expr = _bound(expr.args[0], lookup)
    if not isinstance(expr, GenericConst) or str(expr.value.dtype) not in FLOATS or len(expr.value.shape) != 2:
        return None
    value = np.asarray(expr.value.numpy(), dtype=np.float32)
    return np.transpose(value, axes) if permuted else value


def _few_rows(x):
    """``x`` has known leading dims, ``GEMV_ROWS`` rows or fewer in all (a decode step's)."""
    shape = getattr(x.ty, "shape", None)
    if shape is None or not hasattr(shape, "__len__"):
        return False
    lead = list(shape)[:-1]
    return all(isinstance(d, tvm.tirx.IntImm) for d in lead) and int(np.prod([int(d) for d in lead])) <= GEMV_ROWS


def _whole_groups(quantized):
    """K is a whole number of the weight's groups, or one group shorter than the format's."""
    depth = quantized.values.shape[0]
    return depth % quantized.group == 0 or depth < quantized.group


def _call_of(expr, *ops):
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name in ops


def _leading_ones(ty):
    """A tensor type with known dims, all but the last two of them 1."""
    shape = getattr(ty, "shape", None)
    if shape is None or not hasattr(shape, "__len__") or len(shape) < 3:
        return False
    return all(isinstance(shape[i], tvm.tirx.IntImm) and int(shape[i]) == 1 for i in range(len(shape) - 2))


def _bound(expr, lookup):
    """The value a variable is bound to (``expr`` itself otherwise)."""
    value = lookup(expr) if isinstance(expr, relax.Var) else None
    return expr if value is None else value


@relax.expr_functor.mutator
class _Quantize(relax.PyExprMutator):
    def __init__(self, mod, fmt, report, bf16_dot):
        super().__init__(mod)
        self.fmt, self.report, self.tables, self.bf16_dot = fmt, report, set(), bf16_dot

    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op) or call.op.name != "relax.matmul":
            return call
        weight = _constant_weight(call.args[1], self.lookup_binding)
        if weight is None or min(weight.shape) < MIN_SIDE:
            return call
        fmt = self.fmt.head_format() if weight.shape[::-1] in self.tables else self.fmt   # (the logits')
        if fmt is None:
            return call
        fmt = fmt.for_depth(weight.shape[0])
        quantized = fmt.quantize(weight)
        x, out_dtype = call.args[0], str(call.ty.dtype)
        bf16_prefill = fmt.activations == "bfloat16" and self.bf16_dot and not _few_rows(x)
        if bf16_prefill:
            quantized = quantized.unsigned()         # (int8 symmetric too: one kernel dequantizes)
            self.report.bf16_activations += 1
        if quantized.low is None:                    # int8 symmetric: the scale is an epilogue
            y = relax.op.matmul(x, relax.const(quantized.values), out_dtype="float32")
            y = relax.op.multiply(y, relax.const(quantized.scale[0]))
            stored = quantized.values.nbytes + quantized.scale.nbytes
        else:
            packed = quantized.packed()
            tables = [quantized.padded(t) for t in (quantized.scale, quantized.low)]
            kernel = (dequantize_matmul_bf16 if bf16_prefill else
                      dequantize_gemv if _few_rows(x) and _whole_groups(quantized) else dequantize_matmul)
            y = self.builder_.call_te(kernel, x, relax.const(packed), *map(relax.const, tables),
                                      group=quantized.group, bits=fmt.bits,
                                      primfunc_name_hint=f"{kernel.__name__}_{fmt.name}")
            if packed.shape[0] * PANEL != weight.shape[1]:
                y = relax.op.strided_slice(y, axes=[call.ty.ndim - 1], begin=[0], end=[weight.shape[1]])
            stored = packed.nbytes + sum(t.nbytes for t in tables)
        self.report.weights.append(tuple(weight.shape))
        self.report.formats.append(fmt.name)
        self.report.bytes_before += weight.size * tvm.DataType(str(call.args[1].ty.dtype)).bits // 8
        self.report.bytes_after += stored
        return y if out_dtype == "float32" else relax.op.astype(y, out_dtype)

    def quantize(self, func):
        """``func`` with its dense layers quantized; the logits' layer is one whose weight has
        the shape of an embedding table's transpose (a constant matrix read by ``take``):
        hidden -> vocabulary, tied to the table or not."""
        self.tables = set()

        def _table(node):
            if (isinstance(node, relax.Call) and isinstance(node.op, tvm.ir.Op) and node.op.name == "relax.take"
                    and isinstance(node.args[0], GenericConst) and len(node.args[0].value.shape) == 2):
                self.tables.add(tuple(int(d) for d in node.args[0].value.shape))

        relax.analysis.post_order_visit(func, _table)
        return self.visit_expr(func)


def quantize_weights(mod, spec="int8", target=None):
    """``mod`` with its constant dense weights in ``spec``'s format; ``(mod, QuantizeReport)``.
    A format that asks for bf16 activations gets them in the prefill's layers where ``target``
    has AVX512-BF16; elsewhere they stay as they are (logged)."""
    fmt, report = weight_format(spec), QuantizeReport()
    dot = target is not None and bf16_dot.available(target)
    if fmt.activations == "bfloat16" and not dot:
        LOG.info("weights=%s asked for bf16 activations; target %s has no AVX512-BF16: they stay float32",
                 fmt.name, target)
    mutator = _Quantize(mod, fmt, report, dot)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.quantize(func))
    return mutator.builder_.get(), report


def QuantizeWeights(spec="int8", target=None):  # pylint: disable=invalid-name  (a pass, named as TVM's are)
    """The module pass of ``quantize_weights``."""
    @tvm.transform.module_pass(opt_level=0, name="scanweaver.QuantizeWeights")
    def _pass(mod, _ctx):
        return quantize_weights(mod, spec, target)[0]

    return _pass
