"""``split_prefill``: a model's prefill (its scans fused) as one rank's part of the prompt.

Two things in a recurrent model's prefill read across positions, and each becomes a part's
plus one all-gather:

- each scan: summarize, all-gather, finish (``scan.emit_split_scan``); its last state is the
  whole prompt's on every rank;
- each causal depthwise conv (``conv1d`` padded by ``W - 1`` on the left, Mamba's and
  Mamba-2's short conv): the ``W - 1`` inputs before the part come from the previous rank's
  last ones (zeros on rank 0), all-gathered, in place of the zero padding.

- each attention layer of a hybrid (traced as the placeholder call of ``attention``): one
  all-gather of the parts' keys and values, the part's queries over them, masked by position
  (``attention.emit_split_attention``).  Its rotary embedding reads the part's positions, so
  such a prefill is the one traced with ``position_ids``.

Everything else in these models works per position.  A model with anything else that reads
across positions (a softmax or matmul over the prompt, a cumulative sum left unfused, a conv of
another shape) is refused, naming the op: it would otherwise compute a different function.  The
rank is a new parameter, ``rank`` (a 0-d int64 tensor); with attention, ``lengths`` (the parts'
lengths, (P,) int64) and ``longest`` (a shape, the longest part) follow, and the gathered keys
and values of each attention layer are returned after the states."""
import tvm_ffi
from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

from scanweaver_core.exprs import op_name
from scanweaver_core.scan_op import parse_scan
from scanweaver_core.sequence_parts import view

from .attention import Parts, emit_split_attention, placeholder_args
from .scan import allgather, emit_split_scan

# ops that read across positions and are not split here: a prefill holding one is refused
MIXING = ("relax.cumsum", "relax.cumprod", "relax.nn.attention", "relax.nn.attention_bias", "relax.nn.softmax",
          "relax.matmul", "relax.nn.conv1d", "relax.nn.conv2d")


class SplitRefused(ValueError):
    """The prefill reads across positions in a way ``split_prefill`` does not carry."""


def split_prefill(func, world_size, length_var, positions_at=None):
    """``func`` (a prefill whose scans are fused; its prompt length the symbolic ``length_var``)
    as one rank's part among ``world_size`` ranks, with a ``rank`` parameter appended.  A
    prefill with attention layers needs the index of its ``position_ids`` parameter
    (``positions_at``); ``lengths`` and ``longest`` are appended after ``rank``, the gathered
    keys and values after its outputs."""
    copy = relax.utils.copy_with_new_vars(func)       # (the whole prefill stays in the module)
    length_var = _same_dim(func, copy, length_var)
    func = copy
    rank = relax.Var("rank", relax.TensorType([], "int64"))
    extra, parts = [rank], None
    if positions_at is not None:
        longest = tirx.Var("M", "int64")
        lengths = relax.Var("lengths", relax.TensorType([world_size], "int64"))
        extra += [lengths, relax.Var("longest", relax.ShapeType([longest]))]
        parts = Parts(world_size, lengths, longest, func.params[positions_at])
    splitter = _Splitter(world_size, rank, length_var, parts)
    body = splitter.visit_expr(func.body)
    if splitter.refused:           # (raised here: an exception inside the visitor crosses TVM's FFI)
        raise SplitRefused(splitter.refused[0])
    ret_ty = func.ret_ty
    if splitter.gathered:
        body = _returning_also(body, [x for _, kv in sorted(splitter.gathered.items()) for x in kv])
        ret_ty = body.body.ty
    return relax.Function(list(func.params) + extra, body, ret_ty, func.is_pure, func.attrs)


def _returning_also(body, more):
    """``body`` (a SeqExpr returning a tuple) returning its fields and then ``more``."""
    ret = body.body
    bindings, fields = [], []
    for i, ty in enumerate(ret.ty.fields):
        fields.append(relax.Var(f"output_{i}", ty))
        bindings.append(relax.VarBinding(fields[-1], relax.TupleGetItem(ret, i)))
    fields += more
    out = relax.Var("outputs", relax.TupleType([f.ty for f in fields]))
    bindings.append(relax.VarBinding(out, relax.Tuple(fields)))
    return relax.SeqExpr(list(body.blocks) + [relax.BindingBlock(bindings)], out)


@mutator
class _Splitter(PyExprMutator):
    def __init__(self, world_size, rank, length_var, parts):
        super().__init__()
        self.world_size, self.rank, self.length, self.parts = world_size, rank, length_var, parts
        self.refused = []
        self.gathered = {}      # attention layer -> (keys, values), gathered

    def visit_var_binding_(self, binding):
        value = self.visit_expr(binding.value)
        scan = parse_scan(value)
        attention = placeholder_args(value)
        if attention is not None:
            new = self._attention(binding, *attention)
        elif scan is not None:
            new = self._scan(*scan)
        elif op_name(value) == "relax.nn.conv1d" and self._is_causal_conv(value):
            new = self._conv(value)
        else:
            self._refuse_mixing(binding, value)
            new = value
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(new)))

    def _scan(self, spec, operands):
        given = dict(zip(view(spec).operands, operands))
        got = emit_split_scan(self.builder_, spec, given, self.rank, self.world_size)
        outs = [got[n] for n in view(spec).outputs]
        return outs[0] if len(outs) == 1 else relax.Tuple(outs)

    def _attention(self, binding, layer, scale, window, q, k, v):
        if self.parts is None or window:
            why = "a sliding window" if window else "no position_ids (trace the prefill with them)"
            self.refused.append(f"{binding.var.name}: attention layer {layer} with {why} is not split")
            return binding.value
        out, keys, values = emit_split_attention(self.builder_, self.parts, scale, q, k, v)
        self.gathered[layer] = (self.builder_.emit_output(keys), self.builder_.emit_output(values))
        return out

    @staticmethod
    def _is_causal_conv(call):
        attrs = call.attrs
        width = int(call.args[1].ty.shape.values[2])
        return (str(attrs.data_layout) == "NCW" and [int(p) for p in attrs.padding] == [width - 1, width - 1]
                and [int(s) for s in attrs.strides] == [1] and [int(d) for d in attrs.dilation] == [1])

    def _conv(self, call):
        """The conv of ``[the previous part's last W - 1 inputs, this part's]``, unpadded on the
        left: the same output shape as the zero-padded one, and the same values on one rank."""
        bb = self.builder_
        x, weight = call.args[0], call.args[1]
        batch, channels, length = x.ty.shape.values
        halo = int(weight.ty.shape.values[2]) - 1
        if halo == 0:
            return call
        dtype = x.ty.dtype
        tail = bb.emit(relax.op.strided_slice(x, axes=[2], begin=[length - halo], end=[length]))
        flat = bb.emit(relax.op.reshape(relax.op.astype(tail, "float32"), [int(batch) * int(channels) * halo]))
        every = bb.emit(relax.op.reshape(allgather(bb, flat, self.world_size),
                                         [self.world_size, int(batch), int(channels), halo]))
        previous = relax.op.maximum(relax.op.subtract(self.rank, relax.const(1, "int64")), relax.const(0, "int64"))
        before = bb.emit(relax.op.take(every, previous, axis=0, mode="clip"))
        first = relax.op.astype(relax.op.greater(self.rank, relax.const(0, "int64")), "float32")
        before = bb.emit(relax.op.astype(relax.op.multiply(before, first), dtype))
        joined = bb.emit(relax.op.concat([before, x], axis=2))
        attrs = call.attrs
        return relax.op.nn.conv1d(joined, weight, strides=1, padding=[0, halo], dilation=1, groups=int(attrs.groups),
                                  data_layout="NCW", kernel_layout=str(attrs.kernel_layout),
                                  out_layout=str(attrs.out_layout), out_dtype=str(attrs.out_dtype) or dtype)

    def _refuse_mixing(self, binding, value):
        """Note an op that reads across the prompt's positions (its input has the symbolic
        length on an axis it reduces or contracts), naming it: ``split_prefill`` refuses."""
        name = op_name(value)
        if name not in MIXING or not _has_length(value, self.length):
            return
        if name == "relax.matmul" and not _contracts_length(value, self.length):
            return
        if name == "relax.nn.softmax" and not _on_length_axis(value, self.length):
            return
        self.refused.append(f"{binding.var.name} = {name}(...): reads across the prompt's positions, which a "
                            "split prefill does not carry (only fused scans and causal depthwise convs are split)")


def _same_dim(func, copy, var):
    """The symbolic var of ``copy``'s parameters where ``func``'s have ``var`` (copying a
    function gives it fresh shape vars)."""
    for old, new in zip(func.params, copy.params):
        for d, e in zip(_dims(old), _dims(new)):
            if d.same_as(var):
                return e
    return var


def _dims(expr):
    shape = getattr(getattr(expr, "ty", None), "shape", None)
    return list(getattr(shape, "values", None) or [])


def _mentions(dim, var):
    found = []
    tvm_ffi.structural_walk(dim, lambda n: found.append(n) if n.same_as(var) else None)
    return bool(found)


def _has_length(call, var):
    return any(_mentions(d, var) for arg in call.args if isinstance(arg, relax.Expr) for d in _dims(arg))


def _contracts_length(call, var):
    a, b = (_dims(x) for x in call.args[:2])
    return bool(a) and (_mentions(a[-1], var) or (len(b) >= 2 and _mentions(b[-2], var)))


def _on_length_axis(call, var):
    dims = _dims(call.args[0])
    return bool(dims) and _mentions(dims[int(call.attrs.axis)], var)


POSITIONED = "prefill_positioned"    # a prefill taking (input_ids, position_ids), attention unbound


def add_split_prefill(mod, world_size):
    """``mod`` (``prefill`` and ``decode`` as imported) with its scans fused and
    ``prefill_split``, the prefill as one rank's part (``split_prefill``), added.  A hybrid's
    module also holds ``prefill_positioned`` (its attention calls still placeholders), which
    becomes the split and is dropped."""
    from ..fuse import FuseAffineRecurrences  # pylint: disable=import-outside-toplevel

    mod = FuseAffineRecurrences()(mod)
    positioned = POSITIONED in [gv.name_hint for gv in mod.get_global_vars()]
    prefill = mod[POSITIONED if positioned else "prefill"]
    length = prefill.params[0].ty.shape.values[1]
    split = split_prefill(prefill, world_size, length, positions_at=1 if positioned else None)
    mod["prefill_split"] = split.with_attr("global_symbol", "prefill_split")
    if positioned:
        del mod[POSITIONED]
    return mod
