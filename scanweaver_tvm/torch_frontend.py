"""PyTorch's ``scan`` higher-order op -> ScanWeaver affine scans, for TVM's Relax frontend;
``torch.logcumsumexp`` -> a stabilized scan (TVM has no converter for it).

``torch._higher_order_ops.scan(combine_fn, init, xs, dim=, reverse=)`` survives
``torch.export`` as ``torch.ops.higher_order.scan(combine_graph, [init...], [xs...],
(additional_inputs...))``: ``dim`` and ``reverse`` are not arguments of the op, the user-level
``scan`` already moved ``dim`` to 0 (``movedim``/``permute``) and flipped the inputs (``flip``)
in the exported graph, and moves/flips the stacked outputs back after it.  The op itself always
runs forward along dimension 0: ``carry = init; for t: carry, y_t = combine(carry, x_t...,
*additional_inputs)``, and returns ``[final carry..., stacked ys...]``.  Closed-over tensors
(parameters, buffers, constants) arrive as ``additional_inputs``.  TVM's frontend has no
converter for it ("Unsupported function types ['scan']").

A general combine function cannot run as a parallel scan, but the common recurrence can: carries
each updated as ``h = a*h + b``, ``a`` and ``b`` free of the carries.  The combine graph is
converted twice, by TVM's own aten converters, into one Relax function of "step 0 and step 1"
(``relax_pass.body``), which the shared affine analysis reads: one scan per carry; the ``ys``
(any function of the new and previous carries, the slices and invariants that commutes with
slicing along time) are computed on the whole sequence of states.  Any other combine function
raises ``UnsupportedScan`` (a ``ValueError``) naming the scan node, the combine node and why.

How it plugs in: ``from_exported_program(ep, custom_convert_map=custom_convert_map())``; TVM
looks converters up by ``node.target.__name__`` (``"scan"`` for the op) and calls custom ones
as ``converter(node, importer)``.  Values of the outer graph are ``importer.env[fx_node]``; the
combine graph is a ``GraphModule`` stored there by its ``get_attr`` node.  Relax exprs are
emitted with ``importer.block_builder``.  Nothing in TVM is patched.

``torch.logcumsumexp(x, dim)`` is the den-only stabilized scan with no decay
(``StabilizedScanSpec``): ``log(sum_{s<=t} exp(x_s))`` kept as ``(den', max)``, so it neither
overflows nor underflows at any magnitude (``log(cumsum(exp(x)))`` does both).  ``x`` is viewed
as (before, L, after) with a reshape (no transpose): the time-major layout of the spec.
"""
import math
import sys

from tvm import relax

from relax_pass.body import BodyError, TwoSteps, lift_body, stacked
from scanweaver_core.exprs import tensor_dtype, tensor_shape
from scanweaver_core.scan_op import emit_stabilized_scan
from scanweaver_core.spec import SUPPORTED_DTYPES

__all__ = ["custom_convert_map", "UnsupportedScan", "convert_logcumsumexp"]

class UnsupportedScan(ValueError):
    """A ``scan`` whose combine function is not an affine state update; the message names the
    scan node, the combine node and why."""


def _fail(why):
    raise UnsupportedScan(why) from None


def custom_convert_map():
    """The ``custom_convert_map`` for ``from_exported_program``: ``scan`` -> affine scan, and
    the converters that repair TVM's (``torch_repairs``), and our paged attention's and
    all-reduce's."""
    from .paged_attention import convert_paged_attention
    from .tensor_parallel import convert_all_reduce
    from .torch_repairs import (convert_addmm, convert_cat, convert_conv1d, convert_convolution, convert_exp2,
                                convert_group_norm, convert_topk)

    return {"scan": convert_scan, "conv1d.default": convert_conv1d,
            "convolution.default": convert_convolution, "native_group_norm.default": convert_group_norm,
            "logcumsumexp.default": convert_logcumsumexp, "exp2.default": convert_exp2,
            "topk.default": convert_topk, "cat.default": convert_cat, "addmm.default": convert_addmm,
            "constant_pad_nd.default": convert_constant_pad, "pad.default": convert_constant_pad,
            "paged_attention.default": convert_paged_attention, "all_reduce.default": convert_all_reduce}


def convert_constant_pad(node, importer):
    """``aten.constant_pad_nd`` and ``aten.pad`` (constant mode), negative amounts as slices.
    ``F.pad(x, (w - L, 0))`` (RecurrentGemma's conv window after a prompt of L > w) imports
    as ``nn.pad`` with a width of w - L: its attributes change with L, so a prompt traced at
    several lengths does not generalize.  A negative amount in front becomes the slice that
    keeps the last elements (``x[..., -k:]``, the same at every L: the window idiom), one
    behind keeps the first; positive amounts are padded after, as before."""
    is_pad = node.target.__name__.startswith("pad")        # aten.pad(x, pad, mode, value)
    args = list(node.args) + [None] * 4
    mode = (args[2] or node.kwargs.get("mode", "constant")) if is_pad else "constant"
    value = args[3 if is_pad else 2]
    value = node.kwargs.get("value") if value is None else value
    amounts = list(args[1])
    if mode != "constant" or min(amounts) >= 0:
        return importer._pad(node) if is_pad else importer._constant_pad_nd(node)  # pylint: disable=protected-access
    x = importer.env[node.args[0]]
    emit, shape = importer.block_builder.emit, tensor_shape(x)
    widths = [0] * (2 * len(shape))
    for i in range(0, len(amounts), 2):          # (last axis first, (front, back)) pairs
        axis = len(shape) - 1 - i // 2
        front, back = amounts[i], amounts[i + 1]
        kept = int(shape[axis]) + min(front, 0) + min(back, 0)
        if front < 0:
            x = emit(relax.op.strided_slice(x, axes=[axis], begin=[min(back, 0) - kept], end=[sys.maxsize]))
        if back < 0:
            x = emit(relax.op.strided_slice(x, axes=[axis], begin=[0], end=[kept]))
        widths[2 * axis], widths[2 * axis + 1] = max(front, 0), max(back, 0)
    if max(widths) == 0:
        return x
    return emit(relax.op.nn.pad(x, widths, "constant", 0.0 if value is None else value))


def convert_logcumsumexp(node, importer):
    """``aten.logcumsumexp(x, dim)``: the stabilized den-only scan along ``dim`` (float32,
    float16, bfloat16 as themselves, with a float32 state; float64 computed in float32)."""
    x = importer.env[node.args[0]]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    shape = _static(x, f"logcumsumexp node '{node.name}'")
    if not shape:                                   # a 0-d tensor is its own logcumsumexp
        return x
    dim %= len(shape)
    emit = importer.block_builder.emit
    dtype = tensor_dtype(x)
    if dtype not in SUPPORTED_DTYPES:
        x = emit(relax.op.astype(x, "float32"))
    before, after = math.prod(shape[:dim]), math.prod(shape[dim + 1:])
    seq = emit(relax.op.reshape(x, (before, shape[dim], after)))
    out = emit(relax.op.reshape(emit_stabilized_scan(emit, seq), shape))
    return emit(relax.op.astype(out, dtype)) if dtype not in SUPPORTED_DTYPES else out


def _static(expr, what):
    try:
        return tuple(int(d) for d in expr.ty.shape)
    except (AttributeError, TypeError, ValueError):
        return _fail(f"{what}: needs a static shape, got {getattr(expr, 'ty', expr)}")


def _op_name(node):
    return getattr(node.target, "__name__", str(node.target))


def convert_scan(node, importer):
    """The converter: ``node`` is the ``higher_order.scan`` call of the exported graph."""
    where = f"scan node '{node.name}'"
    if len(node.args) != 4 or node.kwargs:
        _fail(f"{where}: expected scan(combine_fn, init, xs, additional_inputs), got "
              f"{len(node.args)} arguments and kwargs {sorted(node.kwargs)}")
    graph_node, init, xs, extra = node.args
    gm = importer.env[graph_node]
    if not hasattr(gm, "graph"):
        _fail(f"{where}: the combine function is not a graph module")
    where = f"{where}, combine function '{graph_node.name}'"
    if not xs:
        _fail(f"{where}: has no scanned inputs")
    h0s = [importer.env[i] for i in init]
    for i, h0 in enumerate(h0s):
        if not isinstance(getattr(h0, "ty", None), relax.TensorType):
            _fail(f"{where}: initial carry {i} is not a tensor")
    full_xs = [importer.env[x] for x in xs]
    lengths = {_static(x, f"{where}: scanned input {i}")[0] for i, x in enumerate(full_xs)}
    if len(lengths) != 1:
        _fail(f"{where}: scanned inputs differ in length: {sorted(lengths)}")
    length = lengths.pop()
    extras = [importer.env[e] if hasattr(e, "op") else e for e in extra]
    steps, outer, y_vals = _two_steps(importer, gm.graph, h0s, full_xs, extras, where)
    try:
        lifted = lift_body(steps, importer.block_builder.emit, lambda p: outer[p.name], h0s, length, False)
    except BodyError as err:
        _fail(f"{where}: {err}")
    ys = [_as_torch_stacks(importer.block_builder, stacked(importer.block_builder.emit, y, tax, length),
                           length, val, f"{where}: output y{j}")
          for j, ((y, tax), val) in enumerate(zip(lifted.outputs, y_vals))]
    return list(lifted.last) + ys


def _as_torch_stacks(bb, y, length, val, what):
    """A stacked output (time first) shaped like torch's (``(L, *y_t.shape)``)."""
    if val is None:
        return y
    try:
        target = (length,) + tuple(int(d) for d in val.shape)
    except TypeError:
        _fail(f"{what}: needs a static shape, got {tuple(val.shape)}")
    shape = _static(y, what)
    if shape == target:
        return y
    if math.prod(shape) != math.prod(target):      # a lifted value broadcast to y_t's shape
        if len(shape) < len(target):                # (per-step dims padded after time)
            y = bb.emit(relax.op.reshape(y, shape[:1] + (1,) * (len(target) - len(shape)) + shape[1:]))
        y = bb.emit(relax.op.broadcast_to(y, target))
    return bb.emit(relax.op.reshape(y, target))


def _two_steps(importer, graph, h0s, full_xs, extras, where):
    """``(TwoSteps, outer, y_vals)``: the combine graph converted twice (steps 0 and 1) into one
    Relax function by TVM's converters, on placeholders for the previous carries and the scanned
    inputs; ``outer`` maps its parameters to the values they stand for, ``y_vals`` holds the
    ys' example values (their per-step shapes) from the export."""
    nodes = list(graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    output = next(n for n in nodes if n.op == "output")
    n, m = len(h0s), len(full_xs)
    if len(placeholders) != n + m + len(extras):
        _fail(f"{where}: takes {len(placeholders)} inputs, the scan passes {n + m + len(extras)}")
    outer, params = {}, []

    def param(name, ty, stands_for=None):
        var = relax.Var(name, ty)
        params.append(var)
        if stands_for is not None:
            outer[name] = stands_for
        return var

    prev = [param(f"__prev{i}", relax.TensorType((2,) + _static(h, where), h.ty.dtype)) for i, h in enumerate(h0s)]
    seqs = [param(f"__seq{i}", relax.TensorType((2,) + _static(x, where)[1:], x.ty.dtype), x)
            for i, x in enumerate(full_xs)]
    extra_vals = []
    for i, e in enumerate(extras):
        if isinstance(getattr(e, "ty", None), relax.TensorType):
            extra_vals.append(param(f"__outer{i}", e.ty, e))
        else:
            extra_vals.append(e)
    results = list(output.args[0])
    bb, describe, reads, per_copy = relax.BlockBuilder(), {}, [[None] * n for _ in range(2)], []
    saved_bb, saved_env = importer.block_builder, importer.env
    importer.block_builder = bb
    try:
        with bb.function("two_steps", params):
            with bb.dataflow():
                for c in (0, 1):
                    env = {}
                    index = relax.const(c, "int64")
                    for i, ph in enumerate(placeholders[:n]):
                        env[ph] = reads[c][i] = bb.emit(relax.op.take(prev[i], index, axis=0), f"__read{i}_{c}")
                    for i, ph in enumerate(placeholders[n:n + m]):
                        env[ph] = bb.emit(relax.op.take(seqs[i], index, axis=0))
                    for ph, v in zip(placeholders[n + m:], extra_vals):
                        env[ph] = v
                    for node in nodes:
                        if node.op in ("placeholder", "output"):
                            continue
                        env[node] = _convert_node(importer, bb, node, env, where, describe, c)
                    per_copy.append([env[r] if hasattr(r, "op") else relax.const(r, str(h0s[0].ty.dtype))
                                     for r in results])
                out = bb.emit_output(relax.Tuple(per_copy[0] + per_copy[1]))
            bb.emit_func_output(out)
    finally:
        importer.block_builder, importer.env = saved_bb, saved_env
    func = bb.get()["two_steps"]
    named = {c: describe.get(c, {}) for c in (0, 1)}
    pairs = [(v0, named[1][k][0]) for k, (v0, _) in named[0].items() if k in named[1]]
    names = {v.name: text for c in (0, 1) for v, text in named[c].values()}
    steps = TwoSteps(func, list(func.params[:n]), [(reads[0][i], reads[1][i]) for i in range(n)],
                     [(per_copy[0][i], per_copy[1][i]) for i in range(n)],
                     [(per_copy[0][j], per_copy[1][j]) for j in range(n, len(results))],
                     lambda var: names.get(var.name, f"'{var.name}'"), pairs)
    return steps, outer, [getattr(r, "meta", {}).get("val") for r in results[n:]]


def _convert_node(importer, bb, node, env, where, describe, copy):
    name = _op_name(node)
    what = f"{where}: node '{node.name}' ({name})"
    if node.op != "call_function":
        _fail(f"{what}: {node.op} nodes are not supported in a combine function")
    if getattr(node.target, "__module__", "") == "torch.ops.higher_order" or name not in importer.convert_map:
        _fail(f"{what}: {name} is not supported inside a scan combine function")
    importer.env = env
    try:
        out = importer.convert_map[name](node)
    except UnsupportedScan:
        raise
    except Exception as err:  # pylint: disable=broad-except  # a TVM converter failed
        raise UnsupportedScan(f"{what}: {type(err).__name__}: {err}") from None
    if isinstance(out, relax.Call) and not isinstance(getattr(out, "ty", None), relax.TupleType):
        out = bb.emit(out, f"{node.name}_{copy}")
    if isinstance(out, relax.Var) and not any(out.same_as(v) for v in env.values() if isinstance(v, relax.Var)):
        describe.setdefault(copy, {})[node.name] = (out, f"node '{node.name}' ({name})")
    return out
