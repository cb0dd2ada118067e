"""ONNX ``Scan`` and ``Loop`` as ScanWeaver scans, read by the shared affine analysis.

A body is imported twice, by TVM's own converters, into one Relax function of "step 0 and step
1" (``relax_pass.body``): each state input is ``Gather(S, c)`` of a placeholder for the previous
states, each scan input ``Gather(P, c, axis)`` of a placeholder for the whole input, the
iteration number is the constant ``c``.  ``lift_body`` reads every state as ``a*h + b``, checks
that the two copies compute the same thing one step apart, and emits one scan per state and
each per-step output on the whole sequence.  So a body may use any op TVM converts, as long as
what touches the state is affine and what touches per-step values commutes with slicing along
time (elementwise ops, broadcasts, reductions, ``MatMul``/``Einsum``/norms over feature dims).
"""
import contextlib
import io

import numpy as np
import onnx
import tvm
from onnx import helper, numpy_helper
from tvm import relax

from relax_pass.body import BodyError, TwoSteps, lift_body, stacked

_COPIES = (0, 1)


class LoopError(ValueError):
    """Raised by the converters; ``onnx_frontend`` turns it into ``UnsupportedRecurrence``."""


def _shape(expr, what):
    try:
        return tuple(int(d) for d in expr.ty.shape)
    except (AttributeError, TypeError, ValueError):
        raise LoopError(f"{what}: needs a static shape, got {expr.ty} (symbolic dims in a Scan or "
                        "Loop are not supported yet: export with fixed sizes)") from None


def _const(expr):
    return expr.value.numpy() if isinstance(expr, tvm.ir.GenericConst) else None


def _tensor_type(dtype):
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def convert_scan(imp, inputs, attrs, opset, where):
    """ONNX Scan: every state an independent affine recurrence."""
    body, m = attrs["body"], attrs["num_scan_inputs"]
    if opset < 9:
        return _convert_scan8(imp, inputs, attrs, where)
    n = len(inputs) - m
    if m < 1 or n < 1:
        raise LoopError(f"{where}: has {n} loop-carried states and {m} scan inputs; a scan needs "
                        "at least one of each")
    k = len(body.output) - n
    results = _scan(imp, body, inputs[:n], inputs[n:], attrs.get("scan_input_axes", (0,) * m),
                    attrs.get("scan_input_directions", (0,) * m), attrs.get("scan_output_axes", (0,) * k),
                    attrs.get("scan_output_directions", (0,) * k),
                    attrs["tvm_custom"]["num_outputs"] - n, where, {})
    return results[0] if len(results) == 1 else relax.Tuple(results)


def _convert_scan8(imp, inputs, attrs, where):
    """Opset-8 Scan: a batch axis 0 on every state and scan input (time is axis 1), the body
    run per batch element.  Each element is a scan of its own (the body is imported once);
    ``sequence_lens``, if given, must be the full length everywhere."""
    body, m = attrs["body"], attrs["num_scan_inputs"]
    seq_lens, rest = inputs[0], inputs[1:]
    n, k = len(rest) - m, len(body.output) - (len(rest) - m)
    if m < 1 or n < 1:
        raise LoopError(f"{where}: has {n} loop-carried states and {m} scan inputs; a scan needs "
                        "at least one of each")
    h0s, xs = rest[:n], rest[n:]
    shapes = [_shape(x, f"{where}: scan input {i}") for i, x in enumerate(xs)]
    if any(len(s) < 2 for s in shapes):
        raise LoopError(f"{where}: opset-8 scan inputs are (batch, length, ...), got {shapes}")
    batch, length = shapes[0][0], shapes[0][1]
    if seq_lens is not None:
        lens = _const(seq_lens)
        if lens is None or lens.size not in (0, batch) or (lens.size and not (lens == length).all()):
            raise LoopError(f"{where}: sequence_lens must be absent or the full length {length} for "
                            "every batch element (shorter sequences are not scans of one length)")
    if batch > 64:
        raise LoopError(f"{where}: opset-8 Scan with batch {batch}: one scan per batch element; "
                        "re-export with opset >= 9 (no batch axis) for more than 64")
    cache, per_batch = {}, []
    for b in range(batch):
        index = relax.const(b, "int64")
        pick = [imp.bb.emit(relax.op.take(x, index, axis=0)) for x in (*h0s, *xs)]
        per_batch.append(_scan(imp, body, pick[:n], pick[n:], (0,) * m, attrs.get("directions", (0,) * m),
                               (0,) * k, (0,) * k, attrs["tvm_custom"]["num_outputs"] - n, where, cache))
    results = [imp.bb.emit(relax.op.concat([imp.bb.emit(relax.op.expand_dims(r[j], [0])) for r in per_batch], 0))
               for j in range(len(per_batch[0]))]
    return results[0] if len(results) == 1 else relax.Tuple(results)


def _scan(imp, body, h0s, xs, in_axes, in_dirs, out_axes, out_dirs, wanted, where, cache):
    """The results of one Scan (opset-9 semantics): final states, then the stacked outputs.
    ``cache`` keeps the imported body for scans of the same shapes."""
    n, m = len(h0s), len(xs)
    shapes = [_shape(x, f"{where}: scan input {i}") for i, x in enumerate(xs)]
    in_axes = [ax % len(s) for ax, s in zip(in_axes, shapes)]
    in_dirs = [bool(d) for d in in_dirs]
    lengths = {s[ax] for s, ax in zip(shapes, in_axes)}
    if len(lengths) != 1:
        raise LoopError(f"{where}: scan inputs differ in length: {sorted(lengths)}")
    length, reverse = lengths.pop(), in_dirs[0]
    roles = [("state", i) for i in range(n)] + [("slice", i, in_axes[i]) for i in range(m)]
    placeholders = [s[:ax] + (2,) + s[ax + 1:] for s, ax in zip(shapes, in_axes)]

    def sequence(i):  # scan input i in position order (the order of input 0's direction)
        x = xs[i]
        return imp.bb.emit(relax.op.flip(x, in_axes[i])) if in_dirs[i] != reverse else x

    if "steps" not in cache:
        cache["steps"] = _import_two_steps(imp, body, roles, h0s, placeholders, where)
    steps, outer = cache["steps"]
    lifted = _lift(imp, steps, outer, sequence, h0s, length, reverse, where)
    rank = [len(_shape(y, where)) for y, _ in lifted.outputs]
    out_axes = [ax % (r if r else 1) for ax, r in zip(out_axes, rank)]
    results = list(lifted.last)
    for j in range(min(len(lifted.outputs), wanted)):
        y, tax = lifted.outputs[j]
        results.append(stacked(imp.bb.emit, y, tax, length, out_axes[j], bool(out_dirs[j]) != reverse))
    return results


def convert_loop(imp, inputs, attrs, opset, where):  # pylint: disable=unused-argument
    """ONNX Loop with a constant trip count, no early exit, affine states; per-step values are
    slices of outer tensors at the iteration number (``Gather(x, i)``, ``Slice(x, i, i+1)``)."""
    body, trip, cond, h0s = attrs["body"], _const(inputs[0]), inputs[1], inputs[2:]
    if not h0s:
        raise LoopError(f"{where}: has no loop-carried state")
    if trip is None or trip.size != 1:
        raise LoopError(f"{where}: the trip count M must be a constant scalar (a run-time M has "
                        "no static length)")
    if cond is not None and not (_const(cond) is not None and _const(cond).all()):
        raise LoopError(f"{where}: the loop condition must be absent or constant true")
    length = int(trip.reshape(-1)[0])
    if length < 1:
        raise LoopError(f"{where}: trip count {length}; a scan needs at least one step")
    _check_no_early_exit(body, where)
    n = len(h0s)
    if length == 1:
        return _one_step(imp, body, h0s, attrs["tvm_custom"]["num_outputs"])
    roles = [("iter",), ("cond",)] + [("state", i) for i in range(n)]
    steps, outer = _import_two_steps(imp, body, roles, h0s, [], where)
    lifted = _lift(imp, steps, outer, None, h0s, length, False, where)
    wanted = attrs["tvm_custom"]["num_outputs"]
    results = list(lifted.last)
    for y, tax in lifted.outputs[: max(0, wanted - n)]:
        results.append(stacked(imp.bb.emit, y, tax, length))
    return results[0] if len(results) == 1 else relax.Tuple(results)


def _one_step(imp, body, h0s, wanted):
    """A Loop of one iteration is its body, converted once in place (step 1 does not exist to
    compare with, and nothing is left to scan)."""
    saved = dict(imp._nodes)  # pylint: disable=protected-access
    imp._nodes.update({body.input[0].name: relax.const(0, "int64"),  # pylint: disable=protected-access
                       body.input[1].name: relax.const(True, "bool"),
                       **{i.name: h for i, h in zip(body.input[2:], h0s)}})
    try:
        out = imp._convert_subgraph(imp.bb, body)  # pylint: disable=protected-access
    finally:
        imp._nodes = saved  # pylint: disable=protected-access
    out = list(out.fields) if isinstance(out, relax.Tuple) else [out]
    results = out[1:1 + len(h0s)]
    results += [imp.bb.emit(relax.op.expand_dims(y, [0])) for y in out[1 + len(h0s):wanted + 1]]
    return results[0] if len(results) == 1 else relax.Tuple(results)


def _check_no_early_exit(body, where):
    """The condition output must be the condition input (through Identity) or constant true."""
    producers = {o: nd for nd in body.node for o in nd.output}
    inits = {i.name: numpy_helper.to_array(i) for i in body.initializer}
    name = body.output[0].name
    while name in producers and producers[name].op_type == "Identity":
        name = producers[name].input[0]
    node = producers.get(name)
    if name == body.input[1].name:
        return
    if node is not None and node.op_type == "Constant":
        value = numpy_helper.to_array(next(a.t for a in node.attribute if a.name == "value"))
        if value.all():
            return
    if name in inits and inits[name].all():
        return
    raise LoopError(f"{where}: the body's condition output must be the input condition or constant "
                    "true (no early exit)")


def _lift(imp, steps, outer, sequence, h0s, length, reverse, where):
    """``lift_body`` with the body's parameters read as the scan inputs (``sequence(i)``, the
    Scan's) and the outer values they stand for."""
    def leaf(param):
        if param.name.startswith("__seq"):
            return sequence(int(param.name[5:]))
        if param.name in outer:
            return outer[param.name]
        raise LoopError(f"{where}: the body reads '{param.name}', which is not defined")

    try:
        return lift_body(steps, imp.bb.emit, leaf, h0s, length, reverse)
    except BodyError as err:
        raise LoopError(f"{where}: {err}") from None


def _import_two_steps(imp, body, roles, h0s, placeholders, where):
    """``(TwoSteps, outer)``: the body twice as one Relax function, through TVM's converters;
    ``outer`` maps the body's parameters that stand for outer-scope values to those values."""
    from .onnx_frontend import _BodyImporter, _fold_static_shapes  # pylint: disable=import-outside-toplevel,cyclic-import

    for nd in body.node:
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in nd.attribute):
            raise LoopError(f"{where}: body node '{nd.name}' ({nd.op_type}) has a subgraph; nested "
                            "control flow in a body is not supported")
    defined = {i.name for i in body.input} | {i.name for i in body.initializer} | \
        {o for nd in body.node for o in nd.output}
    refs = sorted({i for nd in body.node for i in nd.input if i and i not in defined} |
                  {o.name for o in body.output if o.name not in defined})
    graph_inputs, inits, outer, ref_name = [], [], {}, {}
    for i, h0 in enumerate(h0s):
        shape = _shape(h0, f"{where}: initial state {i}")
        graph_inputs.append(helper.make_tensor_value_info(
            f"__prev{i}", _tensor_type(str(h0.ty.dtype)), (2,) + shape))
    for i, shape in enumerate(placeholders):
        elem = body.input[len(h0s) + i].type.tensor_type.elem_type
        graph_inputs.append(helper.make_tensor_value_info(f"__seq{i}", elem, shape))
    # constants a body slices (``Slice(x, i, i+1)`` of a Constant) are parameters shared by both
    # copies, so TVM does not fold each copy's slice into a constant of its own
    shared = {}
    for x in sorted({nd.input[0] for nd in body.node if nd.op_type in ("Gather", "Slice") and nd.input}):
        value = _body_constant(body, x) if x in defined else _const(imp._nodes.get(x))  # pylint: disable=protected-access
        if value is not None:
            shared[x] = name = f"__outer{len(outer)}"
            outer[name] = relax.const(value)
            graph_inputs.append(helper.make_tensor_value_info(name, _tensor_type(value.dtype), value.shape))
    for r in refs:
        value = imp._nodes.get(r)  # pylint: disable=protected-access
        if value is None:
            raise LoopError(f"{where}: the body reads '{r}', which is not defined")
        if r in shared:
            continue
        if isinstance(value, tvm.ir.GenericConst):
            inits.append(numpy_helper.from_array(value.value.numpy(), r))
            ref_name[r] = r
            continue
        if not isinstance(getattr(value, "ty", None), relax.TensorType):
            raise LoopError(f"{where}: the body reads '{r}', which is not a tensor ({value.ty})")
        ref_name[r] = name = f"__outer{len(outer)}"
        outer[name] = value
        graph_inputs.append(helper.make_tensor_value_info(
            name, _tensor_type(str(value.ty.dtype)), _shape(value, f"{where}: outer value '{r}'")))
    nodes, outputs = [], []
    for c in _COPIES:
        nodes.extend(_copy(body, roles, c, defined, {**ref_name, **shared}, inits, outputs))
    graph = helper.make_graph(nodes, "two_steps", graph_inputs,
                              [helper.make_empty_tensor_value_info(o) for o in outputs], initializer=inits)
    model = _fold_static_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", imp.opset)]))
    importer = _BodyImporter(None, "float32")
    try:
        with contextlib.redirect_stdout(io.StringIO()):   # TVM prints the failing node's inputs
            mod = importer.from_onnx(model.graph, imp.opset)
    except LoopError as err:
        raise LoopError(f"{where}: {err}") from None
    return _two_steps(mod["main"], importer, body, roles), outer


def _copy(body, roles, c, defined, ref_name, inits, outputs):
    """The nodes of copy ``c``: its inputs defined from the placeholders, the body renamed."""
    index = f"__step{c}"
    inits.append(numpy_helper.from_array(np.array(c, np.int64), index))

    def name(x):
        return "" if not x else ref_name[x] if x in ref_name else f"{x}@{c}" if x in defined else x

    nodes = []
    for inp, role in zip(body.input, roles):
        if role[0] == "state":
            nodes.append(helper.make_node("Gather", [f"__prev{role[1]}", index], [name(inp.name)],
                                          name=f"__read{role[1]}@{c}", axis=0))
        elif role[0] == "slice":
            nodes.append(helper.make_node("Gather", [f"__seq{role[1]}", index], [name(inp.name)],
                                          name=f"__slice{role[1]}@{c}", axis=role[2]))
        else:                               # Loop's iteration number and condition
            value = np.array(c, np.int64) if role[0] == "iter" else np.array(True)
            inits.append(numpy_helper.from_array(value, name(inp.name)))
    for init in (i for i in body.initializer if i.name not in ref_name):
        copy = onnx.TensorProto()
        copy.CopyFrom(init)
        copy.name = name(init.name)
        inits.append(copy)
    for k, nd in enumerate(body.node):
        if nd.op_type == "Constant" and nd.output[0] in ref_name:
            continue
        copy = onnx.NodeProto()
        copy.CopyFrom(nd)
        copy.name = f"{_label(k, nd)}@{c}"
        copy.input[:] = [name(x) for x in nd.input]
        copy.output[:] = [name(x) for x in nd.output]
        nodes.append(copy)
    for j, o in enumerate(body.output):
        nodes.append(helper.make_node("Identity", [name(o.name)], [f"__out{j}@{c}"], name=f"__out{j}@{c}"))
        outputs.append(f"__out{j}@{c}")
    return nodes


def _body_constant(body, name):
    """The value of a body initializer or ``Constant`` node (``value`` form) named ``name``."""
    for init in body.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    for nd in body.node:
        if nd.op_type == "Constant" and nd.output[0] == name:
            value = next((a.t for a in nd.attribute if a.name == "value"), None)
            return None if value is None else numpy_helper.to_array(value)
    return None


def _label(k, node):
    return node.name or f"#{k}"


def _two_steps(func, importer, body, roles):
    """The ``TwoSteps`` of the imported function: body outputs are ``[cond]`` (Loop), the new
    states, then the per-step outputs, once per copy."""
    bound = {b.var.name: b.value for blk in func.body.blocks for b in blk.bindings}
    fields = list(bound.get(func.body.body.name, func.body.body).fields)
    n_out = len(body.output)
    copies = [fields[:n_out], fields[n_out:]]
    n = sum(r[0] == "state" for r in roles)
    lead = 1 if roles[0][0] == "iter" else 0
    prev = {p.name: p for p in func.params}
    states = [tuple(importer.result[f"__read{i}@{c}"] for c in _COPIES) for i in range(n)]
    updates = [tuple(copies[c][lead + i] for c in _COPIES) for i in range(n)]
    outputs = [tuple(copies[c][j] for c in _COPIES) for j in range(lead + n, n_out)]
    labels = [_label(k, nd) for k, nd in enumerate(body.node)]
    pairs = [(importer.result[f"{x}@0"], importer.result[f"{x}@1"]) for x in labels
             if all(f"{x}@{c}" in importer.result for c in _COPIES)]
    return TwoSteps(func, [prev[f"__prev{i}"] for i in range(n)], states, updates, outputs,
                    importer.describe, pairs)
