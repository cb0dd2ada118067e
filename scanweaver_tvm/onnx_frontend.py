"""ONNX -> Relax, with ONNX ``Scan`` and ``Loop`` recognized as ScanWeaver affine scans.

TVM's relax ONNX frontend has no converter for ``Scan`` or ``Loop``.  A general loop cannot
run as a parallel scan, but the common recurrence can: loop-carried states each updated as
``h = a*h + b``, ``a`` and ``b`` functions of the step's input slices and loop-invariant
values.  ``onnx_loops`` reads a body with the same affine analysis as the Relax pass and emits
one scan per state; any other body raises ``UnsupportedRecurrence`` (a ``ValueError``) naming
the node and why, before TVM sees it.

How it plugs in: TVM keeps its converter table in ``_get_convert_map()``, with no registration
hook.  ``_Importer`` subclasses TVM's ``ONNXGraphImporter`` and overrides the table's two users:
the unsupported-op check (run on the graph minus Scan/Loop) and ``_convert_operator`` (Scan/Loop
come here, the rest goes to TVM).  Nothing in TVM is patched; its own ``from_onnx`` is unchanged.

Three more departures from TVM's converters, for models exported with fixed sizes (the
``torch.onnx`` TorchScript exporter unrolls a Python loop over time): ``Shape``/``Size`` of
statically shaped tensors become constants before conversion (``_fold_static_shapes``: else
shapes computed from them turn symbolic), ``Gather`` at a constant index is a plain ``take``
(``_gather_constant_index``: no run-time index normalization to fold, per unrolled step), and
``Einsum`` stays a ``relax.einsum`` op instead of an opaque ``call_tir`` (so the selective-scan
matcher can see and evaluate it; it legalizes to the same TE kernel).
"""
import contextlib
import io
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import tvm
from onnx import numpy_helper
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _tvm_onnx

from scanweaver_core.exprs import error_line

from .onnx_loops import LoopError, convert_loop, convert_scan

class UnsupportedRecurrence(ValueError):
    """A model, Scan or Loop that cannot be converted; the message names it and says why."""


def _fail(why):
    raise UnsupportedRecurrence(why) from None  # the message says it all; no chained traceback




def from_onnx(model, trace_sizes=None):
    """Load ``model`` (path or ``onnx.ModelProto``), convert it with TVM's relax frontend plus
    the ``Scan``/``Loop`` converters here, fold constants; return the IRModule.

    A model with ``Scan``/``Loop`` whose inputs have symbolic dims (``dim_param``) is imported
    at a few sizes of each (``trace_sizes``: name -> sizes overrides them), each import fused,
    and the imports generalized into one module with those dims symbolic (``dynamic.traced``)."""
    model = _load(model)
    dims = _symbolic_dims(model.graph)
    if dims and any(n.op_type in _CONVERTERS for n in model.graph.node):
        from relax_pass.fuse import FuseAffineRecurrences

        from . import dynamic

        shapes = [[d.dim_value for d in x.type.tensor_type.shape.dim] for x in _graph_inputs(model.graph)]
        sizes = dynamic.trace_sizes(dynamic.static_dims(shapes, dims), dims, trace_sizes)
        return dynamic.traced(lambda point: _import_fixed(_specialized(model, point)),
                              FuseAffineRecurrences(), sizes)
    return _import_fixed(model)


def _graph_inputs(graph):
    initialized = {t.name for t in graph.initializer}
    return [x for x in graph.input if x.name not in initialized]


def _symbolic_dims(graph):
    """``{(input index, axis): (dim_param, None, None)}`` of the graph's symbolic input dims."""
    out = {}
    for i, x in enumerate(_graph_inputs(graph)):
        for axis, d in enumerate(x.type.tensor_type.shape.dim):
            if d.HasField("dim_param") and d.dim_param:
                out[(i, axis)] = (d.dim_param, None, None)
    return out


def _specialized(model, point):
    """A copy of ``model`` with every ``dim_param`` of ``point`` (name -> size) made that size,
    in the inputs, outputs and value infos alike."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    graph = fixed.graph
    for info in [*graph.input, *graph.output, *graph.value_info]:
        for d in info.type.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param in point:
                d.dim_value = point[d.dim_param]
    return fixed


def _import_fixed(model):
    model = _name_unnamed(_fold_static_shapes(model))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    captured, ours = io.StringIO(), False
    try:
        with contextlib.redirect_stdout(captured):
            mod = _Importer(None, "float32").from_onnx(model.graph, opset)
    except UnsupportedRecurrence:
        ours = True  # TVM printed the failing node's inputs; our message says what matters
        raise
    finally:
        if not ours:
            sys.stdout.write(captured.getvalue())
    return _fold_constants(mod)


def _fold_constants(mod):
    """FoldConstant, except where TVM 0.27's own pass fails (legalizing an op whose input shape is
    unknown: "emit_te now only supports Tensor that has ShapeExpr shape") or breaks the module
    (with a run-time-bounded ``Slice`` it leaves a ``call_tir`` to a ``shape_func`` it removed:
    "There is no definition of I.GlobalVar("shape_func")").  Then the unfolded module is returned
    (it compiles; per-step Gathers stay unfolded, so their recurrences may not be found) and a
    warning says so."""
    try:
        folded = relax.transform.FoldConstant()(mod)
    except (RuntimeError, AssertionError) as err:   # legalizing an op of unknown shape
        warnings.warn(f"relax.transform.FoldConstant failed ({error_line(err)}); "
                      "the model is imported without folding", stacklevel=3)
        return mod
    defined = {g.name_hint for g in folded.get_global_vars()}
    missing = set()
    for _, func in folded.functions_items():
        if isinstance(func, relax.Function):
            missing |= {g.name_hint for g in relax.analysis.all_global_vars(func)} - defined
    if not missing:
        return folded
    warnings.warn(f"relax.transform.FoldConstant left calls to {sorted(missing)} that it removed "
                  "(TVM 0.27, run-time Slice bounds); the model is imported without folding",
                  stacklevel=3)
    return mod


def _load(model):
    """The ModelProto; a missing, corrupt or truncated file is a ValueError naming it."""
    source = "the ONNX ModelProto"
    if not isinstance(model, onnx.ModelProto):
        source = str(model)
        if not Path(model).is_file():
            _fail(f"{source}: no such ONNX file")
        try:
            model = onnx.load(source)
        except Exception as err:  # pylint: disable=broad-except  # DecodeError, OSError, ...
            _fail(f"{source}: not a readable ONNX model, corrupt or truncated "
                  f"({type(err).__name__}: {err})")
    if not model.HasField("graph") or not model.opset_import or model.ir_version < 3:
        _fail(f"{source}: not a complete ONNX model (graph: {model.HasField('graph')}, opset "
              f"imports: {len(model.opset_import)}, ir_version: {model.ir_version}); truncated?")
    _check_inputs(model.graph, source)
    return model


_NO_RELAX_DTYPE = {onnx.TensorProto.COMPLEX64: "complex64", onnx.TensorProto.COMPLEX128: "complex128",
                   onnx.TensorProto.STRING: "string"}


def _check_inputs(graph, source):
    """Refuse inputs TVM's importer would misread: complex/string tensors (Relax has no such
    dtype; TVM fails deep inside without a name) and dimensions declared 0 (it reads 0 as
    "unknown", so an empty sequence would turn into a symbolic length)."""
    for vi in graph.input:
        t = vi.type.tensor_type
        if t.elem_type in _NO_RELAX_DTYPE:
            _fail(f"{source}: input '{vi.name}' is a {_NO_RELAX_DTYPE[t.elem_type]} tensor; "
                  "TVM's Relax has no such dtype")
        for i, d in enumerate(t.shape.dim):
            if d.HasField("dim_value") and d.dim_value == 0:
                _fail(f"{source}: input '{vi.name}' has size 0 in dimension {i}: an empty tensor "
                      "(a scan over it would have L = 0; a scan needs L >= 1)")
    for init in graph.initializer:
        if init.data_type in _NO_RELAX_DTYPE:
            _fail(f"{source}: initializer '{init.name}' is a {_NO_RELAX_DTYPE[init.data_type]} "
                  "tensor; TVM's Relax has no such dtype")


def _name_unnamed(model):
    """Unnamed Scan/Loop nodes get a name that identifies them in our messages: their index in
    the graph and first output (``Scan node '#3 (output y)'``, not ``Scan node ''``)."""
    unnamed = [i for i, n in enumerate(model.graph.node) if n.op_type in _CONVERTERS and not n.name]
    if not unnamed:
        return model
    named = onnx.ModelProto()
    named.CopyFrom(model)
    for i in unnamed:
        node = named.graph.node[i]
        node.name = f"#{i} (output {node.output[0]})" if node.output else f"#{i}"
    return named


def _fold_static_shapes(model):
    """``model`` with every ``Shape``/``Size`` node whose input has a fully static shape
    replaced by a ``Constant`` node holding that shape (or element count); same output names.

    Why: exporters compute reshape/slice targets *from* ``Shape`` (``torch.onnx`` writes
    ``xz.chunk(2, dim=1)`` as ``Shape -> Gather([1]) -> Add -> Div -> Mul -> Slice``).  TVM's
    importer turns ``Shape`` into a ``ShapeExpr``, but a Gather with a 1-element (not 0-D) index
    makes it a run-time tensor again (``shape_to_tensor``, ``take``, ``where``), the arithmetic
    after it stays run-time tensor ops, and the ``Slice`` gets non-constant bounds: a
    ``dynamic_strided_slice`` whose result has an unknown shape (rank only).  Every op after it
    inherits that, and TVM's Einsum converter fails (``emit_te`` needs a ``ShapeExpr`` shape);
    FoldConstant later folds the values, but the shapes stay unknown.  The shapes are in fact
    known: ONNX shape inference (with data propagation, so shapes computed from ``Shape`` values
    are inferred too) gives every tensor of a model exported with fixed sizes a static shape.
    As constants, TVM's converters fold ``Gather``/``Add``/``Div``/... in numpy at import and
    the ``Slice``/``Reshape`` targets are plain integers.  A ``Shape`` whose input is not fully
    known (a dynamic axis) is left to TVM as before, and so is any model shape inference rejects.
    Only the main graph is rewritten (Scan/Loop bodies are converted by ``_Lifter``).

    Repeated to a fixed point, with the integer arithmetic on folded shapes evaluated in
    between (``_fold_integer_nodes``): ONNX's data propagation does not follow ``Div`` and
    friends, so the ``Slice`` bounds of ``chunk`` stay unknown, and every shape after them, until
    they are constants (``torch.onnx`` exports of a two-layer Mamba fail in TVM otherwise).
    """
    for _ in range(MAX_FOLD_ROUNDS):
        folded = _fold_integer_nodes(_fold_once(model))
        if folded is model:
            break
        model = folded
    return model


MAX_CONST_ELEMENTS = 1 << 12     # integer tensors folded at import: shapes and indices, not data


def _fold_integer_nodes(model):
    """``model`` with every main-graph node whose inputs are all constants and whose outputs
    are small integer tensors replaced by ``Constant`` nodes (evaluated by ``onnx.reference``);
    ``model`` itself when there is none."""
    from onnx.reference import ReferenceEvaluator

    graph = model.graph
    known = {init.name: numpy_helper.to_array(init) for init in graph.initializer
             if np.prod(init.dims, dtype=np.int64) <= MAX_CONST_ELEMENTS}
    nodes, changed = [], False
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            try:
                known[node.output[0]] = ReferenceEvaluator(node).run(None, {})[0]
            except Exception:  # pylint: disable=broad-except  # a form we do not fold
                pass
            nodes.append(node)
            continue
        inputs = [i for i in node.input if i]
        if node.domain not in ("", "ai.onnx") or not inputs or any(i not in known for i in inputs) \
                or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            nodes.append(node)
            continue
        try:
            outs = ReferenceEvaluator(node).run(None, {i: known[i] for i in inputs})
        except Exception:  # pylint: disable=broad-except  # left to TVM, as before
            nodes.append(node)
            continue
        if not all(isinstance(o, np.ndarray) and o.dtype.kind in "iub" and o.size <= MAX_CONST_ELEMENTS
                   for o in outs):
            nodes.append(node)
            continue
        for name, value in zip(node.output, outs):
            known[name] = value
            nodes.append(onnx.helper.make_node("Constant", [], [name], name=f"{node.name or name} (folded)",
                                               value=numpy_helper.from_array(value)))
        changed = True
    return _with_nodes(model, nodes) if changed else model


MAX_FOLD_ROUNDS = 16


def _fold_once(model):
    """One round of ``_fold_static_shapes``: ``model`` itself when nothing folds."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as err:  # pylint: disable=broad-except  # inference is an optimization only
        warnings.warn(f"ONNX shape inference failed ({type(err).__name__}: "
                      f"{str(err).strip().splitlines()[0] if str(err).strip() else ''}); Shape "
                      "nodes are left to TVM, so shapes computed from them may turn symbolic",
                      stacklevel=3)
        return model
    graph = inferred.graph
    static = {init.name: tuple(init.dims) for init in graph.initializer}
    for vi in (*graph.input, *graph.value_info, *graph.output):
        t = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and t.HasField("shape") and all(
                d.HasField("dim_value") for d in t.shape.dim):
            static.setdefault(vi.name, tuple(d.dim_value for d in t.shape.dim))
    nodes, changed = [], False
    for node in model.graph.node:
        if node.op_type in ("Shape", "Size") and node.domain in ("", "ai.onnx") \
                and node.input and node.input[0] in static:
            dims = static[node.input[0]]
            if node.op_type == "Size":
                value = np.array(int(np.prod(dims, dtype=np.int64)), dtype=np.int64)
            else:  # opset >= 15: optional start/end (negative: from the back, clamped)
                attrs = {a.name: a.i for a in node.attribute}
                value = np.array(dims[slice(attrs.get("start", 0), attrs.get("end"))], dtype=np.int64)
            node = onnx.helper.make_node("Constant", [], list(node.output), name=node.name,
                                         value=numpy_helper.from_array(value))
            changed = True
        nodes.append(node)
    return _with_nodes(model, nodes) if changed else model


def _with_nodes(model, nodes):
    """A copy of ``model`` whose main graph has ``nodes``."""
    folded = onnx.ModelProto()
    folded.CopyFrom(model)
    del folded.graph.node[:]
    folded.graph.node.extend(nodes)
    return folded


class _Importer(_tvm_onnx.ONNXGraphImporter):
    """TVM's importer, with ``Scan`` and ``Loop`` converted here (see the module docstring)."""

    def _check_for_unsupported_ops(self, graph):
        super()._check_for_unsupported_ops(
            onnx.GraphProto(node=[n for n in graph.node if n.op_type not in _CONVERTERS]))

    def _convert_operator(self, op_name, inputs, attrs, opset):
        if op_name == "Einsum":
            # TVM's converter emits ``topi.einsum`` as an opaque ``call_tir`` right away; the
            # ``relax.einsum`` op legalizes to the same TE later, but until then passes (our
            # selective-scan matcher) can see and evaluate what the einsum computes.
            eq = attrs["equation"]
            eq = eq.decode("utf-8") if isinstance(eq, bytes) else eq
            return self.bb.normalize(relax.op.einsum(list(inputs), eq))
        if op_name == "Gather":
            take = _gather_constant_index(inputs[0], inputs[1], attrs.get("axis", 0))
            if take is not None:
                return self.bb.normalize(take)
        if op_name not in _CONVERTERS:
            return super()._convert_operator(op_name, inputs, attrs, opset)
        where = f"{op_name} node '{attrs['tvm_custom']['name']}'"
        return self.bb.normalize(_CONVERTERS[op_name](self, list(inputs), attrs, opset, where))


def _gather_constant_index(data, indices, axis):
    """``take(data, indices, axis)`` for a Gather of a tensor with a static extent along ``axis``
    at constant in-range ``indices``, negative ones made positive here; else None (TVM converts).

    TVM's converter normalizes negative indices at run time (``shape_of``, ``take``, ``add``,
    ``where``), and FoldConstant then folds those ops one by one, building a kernel for each:
    about 0.3 s per unrolled step of an exported loop (``x[:, t]`` is one Gather per step)."""
    if not isinstance(indices, tvm.ir.GenericConst) or isinstance(data, tvm.ir.GenericConst):
        return None
    ty = getattr(data, "ty", None)
    shape = getattr(ty, "shape", None)
    if not isinstance(ty, relax.TensorType) or not isinstance(shape, relax.ShapeExpr):
        return None
    idx = indices.value.numpy()
    rank = len(shape.values)
    if idx.dtype.kind not in "iu" or not -rank <= axis < rank \
            or not isinstance(shape.values[axis], tvm.tirx.IntImm):
        return None
    extent = int(shape.values[axis])
    if idx.size and not ((idx >= -extent) & (idx < extent)).all():
        return None
    return relax.op.take(data, relax.const(np.where(idx < 0, idx + extent, idx).astype(idx.dtype)),
                         axis % rank)


class _BodyImporter(_Importer):
    """The importer of a loop body (``onnx_loops``): each node's result is bound to a var of its
    own, so ``describe`` can name the body node a var comes from, and the state reads found."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.node_of, self.result = {}, {}    # var name -> (node, op); node -> var

    def _convert_operator(self, op_name, inputs, attrs, opset):
        node = attrs["tvm_custom"]["name"]
        try:
            res = super()._convert_operator(op_name, inputs, attrs, opset)
        except (LoopError, UnsupportedRecurrence):
            raise
        except Exception as err:  # pylint: disable=broad-except  # a TVM converter failed
            raise LoopError(f"body node '{node.rsplit('@', 1)[0]}' ({op_name}): TVM cannot convert "
                            f"it: {_op_error(err)}") from None
        if isinstance(res, relax.Call) and not isinstance(res.ty, relax.TupleType):
            res = self.bb.emit(res, f"n{len(self.node_of)}")
            self.node_of[res.name] = (node, op_name)
            self.result[node] = res
        return res

    def describe(self, var):
        node, op = self.node_of.get(var.name, (None, None))
        return f"'{var.name}'" if node is None else f"body node '{node.rsplit('@', 1)[0]}' ({op})"


def _op_error(err):
    """TVM's error without the repr of the op it starts with (``In ir.Op(... long ...), the
    first input shape ...``)."""
    line = error_line(err)
    if line.startswith("In ir.Op(") and "support_level=" in line:
        name = line.split('name="', 1)[-1].split('"', 1)[0]
        line = f"{name}: {line.split('support_level=', 1)[1].split(', ', 1)[-1]}"
    return line


def _convert(converter):
    def convert(imp, inputs, attrs, opset, where):
        try:
            return converter(imp, inputs, attrs, opset, where)
        except LoopError as err:
            return _fail(str(err))
    return convert


_CONVERTERS = {"Scan": _convert(convert_scan), "Loop": _convert(convert_loop)}
