"""Per-step structure of unrolled recurrences: which bindings are affine steps, and the shape
of their coefficients.

A step is a binding that ``affine.py`` reads as ``a*prev + b`` for a nearby state ``prev`` of its
type (any sum of terms, ``lerp``, casts, layout ops on the state).  A coefficient's *template* is
its expression tree with every per-step slice of a tensor (``take(X, const t, axis)``,
``X[:, t:t+1]``, a ``split`` piece) replaced by the slot ``("slice", X, axis)``: two steps of one
recurrence have equal templates and differ only in ``t``.  Templates are memoized per node, so
detection is linear in the graph.
"""
from dataclasses import dataclass

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from scanweaver_core.affine import STEP_OPS, Affine, NotAffine, affine_in, candidates
from scanweaver_core.exprs import VarMap, call_args, op_name, tensor_dtype, tensor_shape

from .lift import FEATURE_OPS as LIFTABLE

# Ops applied elementwise (with broadcasting): a step's coefficient built from these over
# slices can be computed for all steps at once by applying them to the unsliced tensors.
ELEMENTWISE = {f"relax.{n}" for n in (
    "add", "subtract", "multiply", "divide", "power", "maximum", "minimum", "negative", "exp",
    "log", "sqrt", "rsqrt", "sigmoid", "tanh", "abs", "square", "astype", "clip", "nn.silu",
    "nn.softplus", "log1p", "expm1", "sin", "cos", "erf", "floor", "ceil", "round", "sign",
    "where", "greater", "greater_equal", "less", "less_equal", "equal", "not_equal", "logical_and",
    "logical_or", "logical_not", "nn.relu", "nn.gelu")}
# tensors made from constants (export makes one per step for ``torch.lerp(h, x, 0.5)``'s weight)
CONSTRUCTORS = {"relax.full", "relax.zeros", "relax.ones", "relax.arange"}
# what the affine reading builds coefficients with, besides the elementwise ops
SYNTHETIC = {"relax.where", "relax.broadcast_to", "relax.ones", "relax.permute_dims", "relax.reshape",
             "relax.expand_dims", "relax.squeeze"}
ONE = relax.const(1.0, "float32")


def _step_slice(value_of, value):
    """``(key, t)`` when ``value`` takes time index ``t`` of a tensor along one axis: ``take`` at a
    constant, ``strided_slice`` ``[t:t+1]`` or a piece of an even ``split`` into unit sections."""
    name = op_name(value)
    if name == "relax.take" and len(value.args) == 2:
        t = _const_scalar(value.args[1])
        x_shape = tensor_shape(value.args[0])
        if isinstance(t, int) and tensor_shape(value.args[1]) == () and x_shape is not None:
            axis = int(value.attrs.axis) % len(x_shape)
            if x_shape[axis] > 1:              # (``[:, 0]`` of a unit dim is a squeeze)
                return ("slice", _base(value_of, value.args[0]), axis), t % x_shape[axis]
    if name == "relax.strided_slice":
        x_shape = tensor_shape(value.args[0])
        axes, begin, end = (_int_list(a) for a in value.args[1:4])
        strides = _int_list(value.args[4]) if len(value.args) > 4 else [1]
        if x_shape is None or None in (axes, begin, end, strides) or len(axes) != 1 or strides != [1]:
            return None
        axis = axes[0] % len(x_shape)
        lo, hi = begin[0] % x_shape[axis], end[0] if end[0] >= 0 else end[0] + x_shape[axis]
        if hi - lo == 1 and x_shape[axis] > 1:
            return ("slice", _base(value_of, value.args[0]), axis, "keep"), lo
    if isinstance(value, relax.TupleGetItem) and isinstance(value.tuple_value, relax.Var):
        split = value_of.get(value.tuple_value)
        if op_name(split) == "relax.split":
            x_shape = tensor_shape(split.args[0])
            sections = split.attrs.indices_or_sections
            axis = int(split.attrs.axis) % len(x_shape) if x_shape else 0
            unit = (int(sections) == x_shape[axis] if not hasattr(sections, "__len__") else
                    [int(v) for v in sections] == list(range(1, x_shape[axis]))) if x_shape else False
            if unit and x_shape[axis] > 1:
                return ("slice", _base(value_of, split.args[0]), axis, "keep"), int(value.index)
    return None


WIDTH = {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64}


def _widened_and_back(cast):
    """``x`` when ``cast`` is ``astype(... astype(x, wider) ..., dtype of x)`` through float
    types at least as wide as x's (which changes no value), else None."""
    target = str(cast.attrs.dtype)
    x, widths = cast.args[0], []
    while isinstance(x, relax.Call) and op_name(x) == "relax.astype":
        widths.append(WIDTH.get(str(x.attrs.dtype), 0))
        x = x.args[0]
    dtype = tensor_dtype(x)
    if dtype != target or dtype not in WIDTH or not widths or min(widths) < WIDTH[dtype]:
        return None
    return x


def _int_list(x):
    try:
        return [int(getattr(v, "value", v)) for v in getattr(x, "fields", x)]
    except (TypeError, ValueError):
        return None


def _const_scalar(expr):
    if isinstance(expr, tvm.ir.expr.GenericConst):
        data = expr.value.numpy()
        if data.size == 1:
            return data.reshape(()).item()
    return None


class Ref:
    """A node inside a template key, compared by handle: a plain Relax object would be
    compared with TVM's ``__eq__`` (an FFI type read) on every dict lookup of a key."""

    __slots__ = ("node", "_handle")

    def __init__(self, node):
        self.node, self._handle = node, hash(node)

    def __hash__(self):
        return self._handle

    def __eq__(self, other):
        return isinstance(other, Ref) and other._handle == self._handle


class View(Ref):
    """A sliced tensor that is a layout view of another (``B[:, None, :, t]`` exports one
    ``expand_dims(B)`` per step): equal to every view made the same way of the same tensor, so
    the steps' templates agree; ``node`` is the first such view (any one holds the values)."""

    __slots__ = ("key",)

    def __init__(self, node, key):
        super().__init__(node)
        self.key = key
        self._handle = hash(key)

    def __hash__(self):
        return self._handle

    def __eq__(self, other):
        return isinstance(other, View) and other.key == self.key


_VIEWS = ("relax.expand_dims", "relax.reshape", "relax.permute_dims", "relax.squeeze")


def _base(value_of, x):
    """How a slice names the tensor it slices: ``Ref`` by identity, or a ``View`` by how it
    is made from one."""
    value = value_of.get(x) if isinstance(x, relax.Var) else None
    if op_name(value) in _VIEWS and isinstance(value.args[0], relax.Var):
        inner = _base(value_of, value.args[0])
        return View(x, (op_name(value), str(value.attrs) if value.attrs is not None else "",
                        tensor_shape(x), inner))
    return Ref(x)


@dataclass(frozen=True)
class Template:
    """A coefficient's structure: ``key`` (hashable, equal across steps) and the step index
    of its slices (``None`` when it has none: loop-invariant).  An ``("op", ...)`` key names
    its operands' keys by interned ids (``Analysis.key_of``), so keys stay shallow however deep
    the expression: comparing and hashing them never recurses through a whole chain."""

    key: tuple
    index: object = None        # int, None (no slice) or "mixed"


class Analysis:
    """Templates and step candidates over one function's bindings."""

    def __init__(self, bindings):
        self.value = VarMap((b.var, b.value) for b in bindings if isinstance(b, relax.VarBinding))
        self._templates = VarMap()
        self._ids, self._keys = {}, []     # hash-consing of template keys: key <-> id
        self.position = None                # var -> binding index (made on first use)
        self.not_affine = {}                # step-like var -> (state, NotAffine): why not a step
        self._slices = None                 # (tensor, axis) -> indices it is sliced at (on first use)
        self._clean = {}                    # hash(var) -> ids of keys that do not read var (mentions)

    # -- templates ---------------------------------------------------------------------------
    def template(self, expr):
        if isinstance(expr, (relax.Var, relax.Call, tvm.ir.expr.GenericConst)):
            got = self._templates.get(expr)
            if got is None:
                got = self._templates[expr] = self._template_of_node(expr)
            return got
        if isinstance(expr, relax.Tuple):      # an einsum's or concat's operands (ONNX Einsum)
            children = [self.template(f) for f in expr.fields]
            indices = {c.index for c in children if c.index is not None}
            key = ("tuple", tuple(self._intern(c.key) for c in children))
            if not indices:
                return Template(key)
            return Template(key, indices.pop() if len(indices) == 1 else "mixed")
        # other leaves (clip's bounds, shapes): fresh wrappers per use, so by structure
        return Template(("expr", tvm_ffi.structural_hash(expr)))

    def _template_of_node(self, expr):
        if isinstance(expr, relax.Var):
            return self._template_of(expr, self.value.get(expr))
        if isinstance(expr, tvm.ir.expr.GenericConst):
            # the frontends make a new constant node per use: compare constants by value
            data = expr.value.numpy()
            return Template(("const", data.shape, str(data.dtype), hash(data.tobytes())))
        return self._template_of(None, expr)      # a Call the affine reading built (affine.py)

    def _template_of(self, var, value):
        name = op_name(value)
        if name == "relax.astype":
            inner = _widened_and_back(value)
            if inner is not None:              # x.double().float(): x itself, exactly
                return self.template(inner)
        step = _step_slice(self.value, value)
        if step is not None and name in ("relax.take", "relax.strided_slice") and \
                isinstance(self.template(value.args[0]).index, int) and \
                len(self._slice_indices(value.args[0], step[0][2])) < 2:
            step = None     # x_t[:, :, 0] / x_t[..., :1]: a feature of one step's value, sliced
            #                 once (a tensor sliced at many indices, like ``proj.unbind(0)[0]``
            #                 read at every step, or gathered from many steps, is sliced in time)
        if step is not None:                  # X's slice at one time index: ("slice", X, axis[, keep])
            key, t = step
            return Template(key, t)
        structural = name in ELEMENTWISE or name in LIFTABLE or name in CONSTRUCTORS
        if structural or (var is None and name in SYNTHETIC):
            children = [self.template(a) for a in call_args(value)]
            indices = {c.index for c in children if c.index is not None}
            attrs = str(value.attrs) if value.attrs is not None else ""
            key = ("op", name, attrs, tuple(self._intern(c.key) for c in children))
            if not indices:
                return Template(key)      # invariant, compared structurally
            return Template(key, indices.pop() if len(indices) == 1 else "mixed")
        return Template(("var", Ref(var if var is not None else value)))

    def _slice_indices(self, x, axis):
        """The indices at which bindings slice ``x`` along ``axis`` (one slice op each)."""
        if self._slices is None:
            self._slices = {}
            for val in self.value.values():
                step = _step_slice(self.value, val) if op_name(val) in ("relax.take", "relax.strided_slice") \
                    else None
                if step is not None and isinstance(val.args[0], relax.Var):
                    self._slices.setdefault((hash(val.args[0]), step[0][2]), set()).add(step[1])
        return self._slices.get((hash(x), axis), set()) if isinstance(x, relax.Var) else set()

    def _intern(self, key):
        found = self._ids.get(key)
        if found is None:
            found = self._ids[key] = len(self._keys)
            self._keys.append(key)
        return found

    def key_of(self, key_id):
        """The key an ``("op", ...)`` key refers to by id."""
        return self._keys[key_id]

    def mentions(self, key, var):
        """Whether the expression behind ``key`` reads ``var`` (walked without recursion).  The
        keys found not to read ``var`` are remembered: a chain step's template holds the chain
        before it, and every step asks about the same few states."""
        clean = self._clean.setdefault(hash(var), set())
        stack, seen = [key], set()
        while stack:
            k = stack.pop()
            if isinstance(k, tuple):
                if k and k[0] == "op":
                    fresh = [i for i in k[3] if i not in seen and i not in clean]
                    seen.update(fresh)
                    stack.extend(self._keys[i] for i in fresh)
                else:
                    stack.extend(k)
            elif isinstance(k, Ref) and k.node.same_as(var):
                return True
        clean.update(seen)
        return False

    # -- steps -------------------------------------------------------------------------------
    def positions(self):
        """var -> binding index; an unbound var (a parameter) sits just before its first use,
        since no binding before that can depend on it."""
        if self.position is None:
            self.position = VarMap((v, i) for i, v in enumerate(self.value))
            for i, val in enumerate(self.value.values()):
                for a in call_args(val) if isinstance(val, relax.Call) else ():
                    if isinstance(a, relax.Var) and a not in self.position:
                        self.position[a] = i - 1
        return self.position

    def step_candidates(self, var):
        """The readings ``(prev, a, b)`` of binding ``var`` as ``a*prev + b`` (``affine.py``),
        nearest state first, each read when asked for (a chain links by the first)."""
        value = self.value.get(var)
        if op_name(value) not in STEP_OPS or tensor_shape(var) is None:
            return
        self.positions()
        for p in candidates(self.value, var):
            if isinstance(p, tvm.ir.expr.GenericConst) and not self.is_zeros(p):
                continue
            r = affine_in(self.value, self.position, var, p)
            if isinstance(r, Affine):
                b = r.off if r.off is not None else relax.const(0.0, tensor_dtype(var))
                yield p, ONE if r.coef is None else r.coef, b
            elif isinstance(r, NotAffine):
                self.not_affine.setdefault(var, (p, r))

    def is_zeros(self, var):
        """True when ``var`` is bound to a tensor of zeros (``full(.., 0)``, ``zeros``, a constant)."""
        value = self.value.get(var, var)
        name = op_name(value)
        if name == "relax.zeros":
            return True
        if name in ("relax.full", "relax.full_like"):
            return _const_scalar(value.args[1]) == 0
        if name == "relax.zeros_like":
            return True
        data = getattr(value, "value", None) if isinstance(value, tvm.ir.expr.GenericConst) else None
        return data is not None and not np.any(data.numpy())
