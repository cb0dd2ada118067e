"""ONNX -> Relax, with ONNX ``Scan`` and ``Loop`` recognized as ScanWeaver affine scans.

TVM's relax ONNX frontend has no converter for ``Scan`` or ``Loop``.  A general loop cannot
run as a parallel scan, but the common recurrence can: one loop-carried state updated as
``h = a*h + b``, ``a`` and ``b`` elementwise functions of the step's input slices and
loop-invariant values.  Such a body is lifted from one step to the whole sequence (the same
elementwise ops on the full inputs, scan axis kept, invariant operands given a unit axis there)
and becomes one ``make_scan`` call.  Any other body raises ``UnsupportedRecurrence`` (a
``ValueError``) naming the node and why, before TVM sees it.

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
from collections import namedtuple
from pathlib import Path

import numpy as np
import onnx
import tvm
from onnx import numpy_helper
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _tvm_onnx

from relax_pass.exprs import error_line
from relax_pass.scan_op import make_scan

from .spec import AffineScanSpec

# Ops that act per element (with broadcasting), so applying them to a whole sequence at once
# equals applying them slice by slice.  Only these may touch per-step values.
ELEMENTWISE = frozenset(
    "Add Sub Mul Div Neg Abs Exp Log Sqrt Reciprocal Pow Sigmoid Tanh Relu LeakyRelu Elu Selu "
    "Softplus Softsign Erf Sin Cos Max Min Sum Mean Clip Where Cast Identity HardSigmoid".split())


class UnsupportedRecurrence(ValueError):
    """A model, Scan or Loop that cannot be converted; the message names it and says why."""


def _fail(why):
    raise UnsupportedRecurrence(why) from None  # the message says it all; no chained traceback


# A state-dependent value a*h + b; a, b: 0, 1, -1 or a term (relax expr, varying), where
# varying terms are whole sequences in canonical layout (see _Lifter).
_Aff = namedtuple("_Aff", "a b")


def from_onnx(model):
    """Load ``model`` (path or ``onnx.ModelProto``), convert it with TVM's relax frontend plus
    the ``Scan``/``Loop`` converters here, fold constants; return the IRModule."""
    model = _name_unnamed(_fold_static_shapes(_load(model)))
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
    """
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
    if not changed:
        return model
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


def _shape(expr, what):
    try:
        return tuple(int(d) for d in expr.ty.shape)
    except (AttributeError, TypeError, ValueError):
        _fail(f"{what}: needs a static shape, got {expr.ty}")


def _const(expr):  # the value of a constant as numpy, else None
    return expr.value.numpy() if isinstance(expr, tvm.ir.GenericConst) else None


def _is(x, k):
    return isinstance(x, (int, float)) and x == k


class _Lifter:
    """Walks one loop body, tracking which values are a*h + b, per-step (lifted to the whole
    sequence) or loop-invariant, and emits the scan.  Canonical layout of a whole sequence:
    the state's shape with the length-L scan axis inserted at ``axis``."""

    def __init__(self, imp, where, h0, length, axis, reverse):
        self.imp, self.where, self.h0 = imp, where, h0
        self.length, self.axis, self.reverse = length, axis, reverse
        self.state_shape, self.dtype = _shape(h0, f"{where}: the initial state"), h0.ty.dtype
        self.env = {}

    def emit(self, expr):
        return self.imp.bb.emit(expr) if isinstance(expr, relax.Call) else expr

    def seq(self, x, axis, flip):
        """The full sequence ``x`` (scan axis ``axis``) in canonical layout."""
        shape, r = _shape(x, f"{self.where}: a scan input"), len(self.state_shape)
        if len(shape) - 1 > r:
            _fail(f"{self.where}: a slice of rank {len(shape) - 1} exceeds the state's rank {r}")
        if shape[axis] != self.length:  # Loop: only the first M entries are gathered
            x = self.emit(relax.op.strided_slice(x, [axis], [0], [self.length]))
        if flip:
            x = self.emit(relax.op.flip(x, axis))
        rest, pad = [i for i in range(len(shape)) if i != axis], r + 1 - len(shape)
        perm = rest[:self.axis] + [axis] + rest[self.axis:]
        if pad:  # L to the front, slice dims left-padded to the state's rank, L to self.axis
            x = self.emit(relax.op.permute_dims(x, [axis] + rest)) if axis else x
            x = self.emit(relax.op.expand_dims(x, list(range(1, 1 + pad))))
            perm = [*range(1, self.axis + 1), 0, *range(self.axis + 1, r + 1)]
        if perm != list(range(r + 1)):
            x = self.emit(relax.op.permute_dims(x, perm))
        return x

    def lift(self, t):
        """A number or term as an expr that broadcasts against canonical layout."""
        if isinstance(t, (int, float)):
            return relax.const(float(t), self.dtype)
        expr, varying = t
        shape, r = _shape(expr, f"{self.where}: a loop-invariant value"), len(self.state_shape)
        if varying or not shape:
            return expr
        if len(shape) > r:
            _fail(f"{self.where}: a loop-invariant value {shape} outranks the state {self.state_shape}")
        shape = (1,) * (r - len(shape)) + shape
        return self.emit(relax.op.reshape(expr, shape[:self.axis] + (1,) + shape[self.axis:]))

    def bin(self, fn, x, y):
        varying = any(not isinstance(t, (int, float)) and t[1] for t in (x, y))
        ex, ey = (self.lift(t) if varying or isinstance(t, (int, float)) else t[0] for t in (x, y))
        return (self.emit(fn(ex, ey)), varying)

    def add(self, x, y, sign):  # x + sign*y, folding zero coefficients
        if _is(y, 0) or _is(x, 0):
            return x if _is(y, 0) else self.mul(y, sign)
        return self.bin(relax.op.add if sign > 0 else relax.op.subtract, x, y)

    def mul(self, x, y):  # folding 0 and 1
        if _is(x, 0) or _is(y, 0):
            return 0
        return y if _is(x, 1) else x if _is(y, 1) else self.bin(relax.op.multiply, x, y)

    def value(self, name, what):
        if name in self.env or name == "":  # "": an omitted optional input
            return self.env.get(name)
        if name in self.imp._nodes:  # outer scope: loop-invariant
            return (self.imp._nodes[name], False)
        return _fail(f"{what}: input '{name}' is not defined")

    def walk(self, body):
        for init in body.initializer:
            self.env[init.name] = (relax.const(numpy_helper.to_array(init)), False)
        for node in body.node:
            what = f"{self.where}: body node '{node.name}' ({node.op_type})"
            try:
                out = self.step(node, [self.value(i, what) for i in node.input], what)
            except UnsupportedRecurrence:
                raise
            except Exception as err:  # pylint: disable=broad-except  # a TVM converter failed
                raise UnsupportedRecurrence(f"{what}: {type(err).__name__}: {err}") from err
            for name, v in zip(node.output, out if isinstance(out, list) else [out]):
                self.env[name] = v

    def step(self, node, args, what):
        op = node.op_type
        if op == "Identity":
            return args[0]
        if op == "Gather" and len(args) == 2 and args[1] == "iter":
            return self.gather(node, args[0], what)
        if any(isinstance(a, str) for a in args):
            _fail(f"{what}: uses the iteration number or condition; only Gather(x, "
                  "iteration_num) and Identity(cond) are supported")
        if any(isinstance(a, _Aff) for a in args):
            return self.affine(op, args, what)
        varying = any(a is not None and a[1] for a in args)
        if varying and op not in ELEMENTWISE:
            _fail(f"{what}: is not elementwise, so it cannot run on the whole sequence at once")
        exprs = [None if a is None else self.lift(a) if varying else a[0] for a in args]
        attr = self.imp._parse_attr(node.attribute)
        attr["tvm_custom"] = {"name": node.name, "num_outputs": len(node.output)}
        res = self.imp._convert_operator(op, _tvm_onnx.onnx_input(exprs), attr, self.imp.opset)
        if isinstance(res.ty, relax.TupleType):
            return [(self.emit(relax.TupleGetItem(res, i)), varying) for i in range(len(res.ty.fields))]
        return (self.emit(res), varying)

    def affine(self, op, args, what):
        """Propagate a*h + b through an op with a state-dependent operand, or refuse."""
        f = [a if isinstance(a, _Aff) else _Aff(0, a) for a in args]
        if op == "Neg":
            return _Aff(self.mul(f[0].a, -1), self.mul(f[0].b, -1))
        if op in ("Add", "Sub") and len(f) == 2:
            sign = 1 if op == "Add" else -1
            return _Aff(self.add(f[0].a, f[1].a, sign), self.add(f[0].b, f[1].b, sign))
        if op == "Mul" and len(args) == 2:
            if all(isinstance(a, _Aff) for a in args):
                _fail(f"{what}: multiplies two state-dependent values (state*state, or a "
                      "coefficient computed from the state): not affine in the state")
            h, c = args if isinstance(args[0], _Aff) else args[::-1]
            return _Aff(self.mul(h.a, c), self.mul(h.b, c))
        if op == "Div" and len(args) == 2 and not isinstance(args[1], _Aff):
            div = lambda t: t if _is(t, 0) else self.bin(relax.op.divide, t, args[1])  # noqa: E731
            return _Aff(div(f[0].a), div(f[0].b))
        return _fail(f"{what}: applies {op} to a state-dependent value; only a*state + b (Add, "
                     "Sub, Neg, Identity, Mul/Div by state-free values) converts to a scan")

    def gather(self, node, data, what):
        """Loop: ``Gather(x, iteration_num, axis)`` of an outer tensor is a per-step slice."""
        if isinstance(data, (_Aff, str)) or data[1]:
            _fail(f"{what}: gathers from a value computed in the loop")
        shape = _shape(data[0], what)
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0) % len(shape)
        if shape[axis] < self.length:
            _fail(f"{what}: gathers {self.length} steps from an axis of length {shape[axis]}")
        return (self.seq(data[0], axis, flip=False), True)

    def scan(self, new_state, collected, outputs):
        """Emit the scan of body output ``new_state``; the ``collected`` body outputs must be
        it too, stacked per ``outputs`` (axis, reverse).  Returns the final state, then those."""
        v = self.value(new_state, self.where)
        for name in collected:
            if self.value(name, self.where) is not v:
                _fail(f"{self.where}: scan output '{name}' is not the new state; only the "
                      "states themselves can be collected")
        if isinstance(v, str) or v is None:
            _fail(f"{self.where}: the new state is not a tensor")
        v = v if isinstance(v, _Aff) else _Aff(0, v)  # h = b: a is 0
        full = self.state_shape[:self.axis] + (self.length,) + self.state_shape[self.axis:]
        a, b = self.lift(v.a), self.lift(v.b)
        a_shape, b_shape = _shape(a, self.where), _shape(b, self.where)
        for name, t, shape in (("a", a, a_shape), ("b", b, b_shape)):
            if t.ty.dtype != self.dtype:
                _fail(f"{self.where}: {name} is {t.ty.dtype}, the state {self.dtype}")
            if len(shape) > len(full) or any(m not in (1, n) for m, n in zip(shape[::-1], full[::-1])):
                _fail(f"{self.where}: {name} of shape {shape} does not broadcast to {full}")
        if len(a_shape) < len(full):
            a = self.emit(relax.op.reshape(a, (1,) * (len(full) - len(a_shape)) + a_shape))
        if b_shape != full:
            b = self.emit(relax.op.broadcast_to(b, full))
        kinds = ("states", "last") if outputs else ("last",)
        try:
            spec = AffineScanSpec.create(full, _shape(a, self.where), self.axis, self.reverse,
                                         True, self.dtype, kinds)
        except ValueError as err:
            _fail(f"{self.where}: {err}")
        call = self.emit(make_scan(spec, [a, b, self.h0]))
        get = {k: call if len(kinds) == 1 else self.emit(relax.TupleGetItem(call, i))
               for i, k in enumerate(kinds)}
        results = [get["last"]]
        for axis, reverse in outputs:
            y = get["states"]
            if reverse != self.reverse:  # ONNX stacks by iteration, the scan by position
                y = self.emit(relax.op.flip(y, self.axis))
            if axis != self.axis:
                order = [i for i in range(len(full)) if i != self.axis]
                y = self.emit(relax.op.permute_dims(y, order[:axis] + [self.axis] + order[axis:]))
            results.append(y)
        return results[0] if len(results) == 1 else relax.Tuple(results)


def _convert_scan(imp, inputs, attrs, opset, where):
    """ONNX Scan (opset >= 9) with one state and an affine body."""
    if opset < 9:
        _fail(f"{where}: opset {opset} Scan (batch axis, sequence_lens) is not supported")
    body, m = attrs["body"], attrs["num_scan_inputs"]
    if len(inputs) - m != 1 or m < 1:
        _fail(f"{where}: has {len(inputs) - m} loop-carried states and {m} scan inputs; only one "
              "state (h = a*h + b) over at least one scan input converts to a scan")
    h0, xs, k = inputs[0], inputs[1:], len(body.output) - 1
    shapes = [_shape(x, f"{where}: scan input {i}") for i, x in enumerate(xs)]
    in_axes = [ax % len(s) for ax, s in zip(attrs.get("scan_input_axes", (0,) * m), shapes)]
    in_dirs = [bool(d) for d in attrs.get("scan_input_directions", (0,) * m)]
    lengths = {s[ax] for s, ax in zip(shapes, in_axes)}
    if len(lengths) != 1:
        _fail(f"{where}: scan inputs differ in length: {sorted(lengths)}")
    rank = len(_shape(h0, f"{where}: the initial state")) + 1
    out_axes = [ax % rank for ax in attrs.get("scan_output_axes", (0,) * k)]
    out_dirs = [bool(d) for d in attrs.get("scan_output_directions", (0,) * k)]
    axis = out_axes[0] if k else in_axes[0] if len(shapes[0]) == rank else 0
    lifter = _Lifter(imp, where, h0, lengths.pop(), axis, in_dirs[0])
    lifter.env[body.input[0].name] = _Aff(1, 0)
    for i, x in enumerate(xs):
        lifter.env[body.input[1 + i].name] = (lifter.seq(x, in_axes[i], in_dirs[i] != in_dirs[0]), True)
    lifter.walk(body)
    wanted = attrs["tvm_custom"]["num_outputs"] - 1  # trailing outputs may be omitted
    return lifter.scan(body.output[0].name, [o.name for o in body.output[1:1 + wanted]],
                       list(zip(out_axes, out_dirs))[:wanted])


def _convert_loop(imp, inputs, attrs, opset, where):  # pylint: disable=unused-argument
    """ONNX Loop with a constant trip count, no early exit, one state h = a*h + b whose
    per-step operands are ``Gather(x, iteration_num, axis)`` of outer tensors."""
    body, trip, cond, states = attrs["body"], _const(inputs[0]), inputs[1], inputs[2:]
    if len(states) != 1:
        _fail(f"{where}: has {len(states)} loop-carried states; only one (h = a*h + b) "
              "converts to a scan")
    if trip is None or trip.size != 1:
        _fail(f"{where}: the trip count M must be a constant scalar")
    if cond is not None and not (_const(cond) is not None and _const(cond).all()):
        _fail(f"{where}: the loop condition must be absent or constant true")
    if int(trip.reshape(-1)[0]) < 1:
        _fail(f"{where}: trip count {trip}; a scan needs at least one step")
    lifter = _Lifter(imp, where, states[0], int(trip.reshape(-1)[0]), axis=0, reverse=False)
    lifter.env.update({body.input[0].name: "iter", body.input[1].name: "cond",
                       body.input[2].name: _Aff(1, 0)})
    lifter.walk(body)
    c = lifter.value(body.output[0].name, where)
    if not (c == "cond" or type(c) is tuple and _const(c[0]) is not None and _const(c[0]).all()):
        _fail(f"{where}: the body's condition output must be the input condition or constant "
              "true (no early exit)")
    collected = [o.name for o in body.output[2:1 + attrs["tvm_custom"]["num_outputs"]]]
    return lifter.scan(body.output[1].name, collected, [(0, False)] * len(collected))


_CONVERTERS = {"Scan": _convert_scan, "Loop": _convert_loop}
