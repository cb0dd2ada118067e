"""PyTorch's ``scan`` higher-order op -> a ScanWeaver affine scan, for TVM's Relax frontend.

``torch._higher_order_ops.scan(combine_fn, init, xs, dim=, reverse=)`` survives
``torch.export`` as ``torch.ops.higher_order.scan(combine_graph, [init...], [xs...],
(additional_inputs...))``: ``dim`` and ``reverse`` are not arguments of the op, the user-level
``scan`` already moved ``dim`` to 0 (``movedim``/``permute``) and flipped the inputs (``flip``)
in the exported graph, and moves/flips the stacked outputs back after it.  The op itself always
runs forward along dimension 0: ``carry = init; for t: carry, y_t = combine(carry, x_t...,
*additional_inputs)``, and returns ``[final carry..., stacked ys...]``.  Closed-over tensors
(parameters, buffers, constants) arrive as ``additional_inputs``.  TVM's frontend has no
converter for it ("Unsupported function types ['scan']").

A general combine function cannot run as a parallel scan, but the common recurrence can: one
carry updated as ``h = a*h + b`` (any operand order, ``a`` may be 1), ``a`` and ``b``
elementwise functions of the step's slices and loop-invariant values.  ``_Combine`` walks the
combine graph, tracking each value as affine in the carry (``_Aff``), per step (lifted to the
whole sequence: the same aten op applied to the full ``xs``, converted by TVM's own converter),
or loop-invariant, then emits one ``make_scan``.  The collected ``ys`` may be the new carry (or
a clone of it) or any elementwise function of the new carry, the previous carry, the slices and
invariants (``y = C_t * h``, ``tanh(h)``, ``h_prev``); they are computed on the whole sequence
of states after the scan.  Any other combine function raises ``UnsupportedScan`` (a
``ValueError``) naming the scan node, the combine node and why, e.g. ``tanh(h) is not affine
in the carry``.

How it plugs in: ``from_exported_program(ep, custom_convert_map=custom_convert_map())``; TVM
looks converters up by ``node.target.__name__`` (``"scan"`` for the op) and calls custom ones
as ``converter(node, importer)``.  Values of the outer graph are ``importer.env[fx_node]``; the
combine graph is a ``GraphModule`` stored there by its ``get_attr`` node.  Relax exprs are
emitted with ``importer.block_builder``.  Nothing in TVM is patched.
"""
import math
import operator
from collections import namedtuple

from tvm import relax

from relax_pass.scan_op import make_scan

from .spec import AffineScanSpec

__all__ = ["custom_convert_map", "UnsupportedScan", "ELEMENTWISE"]

# Aten ops (``OpOverload.__name__``, after ``run_decompositions``) that act per element with
# broadcasting: applying them to whole sequences equals applying them slice by slice.  Only
# these may touch per-step values; loop-invariant values may go through any op TVM converts.
ELEMENTWISE = frozenset("""
    abs.default neg.default exp.default expm1.default log.default log1p.default log2.default
    log10.default sqrt.default rsqrt.default reciprocal.default sigmoid.default tanh.default
    relu.default silu.default gelu.default softplus.default erf.default sin.default cos.default
    sign.default elu.default celu.default selu.default leaky_relu.default hardsigmoid.default
    hardswish.default hardtanh.default square.default floor.default ceil.default round.default
    trunc.default clamp.default clamp.Tensor clamp_min.default clamp_max.default
    pow.Tensor_Scalar pow.Tensor_Tensor pow.Scalar add.Tensor add.Scalar sub.Tensor sub.Scalar
    rsub.Scalar rsub.Tensor mul.Tensor mul.Scalar div.Tensor div.Scalar maximum.default
    minimum.default where.self gt.Tensor gt.Scalar lt.Tensor lt.Scalar ge.Tensor ge.Scalar
    le.Tensor le.Scalar eq.Tensor eq.Scalar ne.Tensor ne.Scalar logical_not.default
    logical_and.default logical_or.default _to_copy.default clone.default alias.default
    detach.default lift_fresh_copy.default
""".split())

# Ops that return their (only tensor) input unchanged; an affine value passes through them.
_IDENTITY = frozenset("clone.default alias.default detach.default lift_fresh_copy.default "
                      "contiguous.default _to_copy.default".split())


class UnsupportedScan(ValueError):
    """A ``scan`` whose combine function is not an affine state update; the message names the
    scan node, the combine node and why."""


def _fail(why):
    raise UnsupportedScan(why) from None


def custom_convert_map():
    """The ``custom_convert_map`` for ``from_exported_program``: ``scan`` -> affine scan."""
    return {"scan": convert_scan}


# A carry-dependent value a*h + b; a and b are terms: a Python number or ``(expr, varying)``,
# varying exprs being whole sequences (L first, slice dims left-padded to the carry's rank).
_Aff = namedtuple("_Aff", "a b")


def _is(x, k):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == k


def _static(expr, what):
    try:
        return tuple(int(d) for d in expr.ty.shape)
    except (AttributeError, TypeError, ValueError):
        return _fail(f"{what}: needs a static shape, got {getattr(expr, 'ty', expr)}")


def _op_name(node):
    return getattr(node.target, "__name__", str(node.target))


def _short(node):
    return _op_name(node).split(".")[0]


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
    if len(init) != 1:
        _fail(f"{where}: has {len(init)} carries; only one carry (h = a*h + b) converts to a scan")
    if not xs:
        _fail(f"{where}: has no scanned inputs")
    h0 = importer.env[init[0]]
    if not isinstance(getattr(h0, "ty", None), relax.TensorType):
        _fail(f"{where}: the initial carry is not a tensor")
    combine = _Combine(importer, where, h0)
    full_xs = [importer.env[x] for x in xs]
    lengths = {_static(x, f"{where}: scanned input {i}")[0] for i, x in enumerate(full_xs)}
    if len(lengths) != 1:
        _fail(f"{where}: scanned inputs differ in length: {sorted(lengths)}")
    combine.length = lengths.pop()
    return combine.run(gm.graph, full_xs, [importer.env[e] if hasattr(e, "op") else e
                                           for e in extra])


class _Combine:
    """Walks one combine graph (see the module docstring)."""

    def __init__(self, importer, where, h0):
        self.imp, self.bb, self.where, self.h0 = importer, importer.block_builder, where, h0
        self.state_shape = _static(h0, f"{where}: the initial carry")
        self.rank, self.dtype = len(self.state_shape), h0.ty.dtype
        self.length = None
        self.vals, self.carry = {}, None
        self.scanned = False  # set once the scan is emitted (then only the ys are left)
        self.states = self.prev = None  # prev: the carries before each step, made on first use
        self.materialized = {}  # id(affine value) -> (it, a*prev + b)

    # ---- terms -----------------------------------------------------------------------------

    def emit(self, expr):
        return self.bb.emit(expr) if isinstance(expr, (relax.Call, relax.TupleGetItem)) else expr

    def lift(self, t, varying):
        """A term as an expr that broadcasts against whole sequences when ``varying``."""
        if isinstance(t, (int, float)):
            return relax.const(float(t), self.dtype)
        expr, _ = t
        if varying and not t[1]:
            shape = _static(expr, f"{self.where}: a loop-invariant value")
            if len(shape) > self.rank:
                _fail(f"{self.where}: a loop-invariant value of shape {shape} has a higher rank "
                      f"than the carry {self.state_shape}")
        return expr

    def bin(self, fn, pyfn, x, y):
        if isinstance(x, (int, float)) and isinstance(y, (int, float)):
            return pyfn(x, y)
        varying = any(not isinstance(t, (int, float)) and t[1] for t in (x, y))
        return (self.emit(fn(self.lift(x, varying), self.lift(y, varying))), varying)

    def add(self, x, y, sign=1):  # x + sign*y, folding zeros
        if _is(y, 0):
            return x
        if _is(x, 0):
            return y if sign > 0 else self.mul(y, -1)
        if sign > 0:
            return self.bin(relax.op.add, operator.add, x, y)
        return self.bin(relax.op.subtract, operator.sub, x, y)

    def mul(self, x, y):  # folding 0 and 1
        if _is(x, 0) or _is(y, 0):
            return 0
        if _is(x, 1):
            return y
        if _is(y, 1):
            return x
        return self.bin(relax.op.multiply, operator.mul, x, y)

    def div(self, x, y):
        return x if _is(x, 0) else self.bin(relax.op.divide, operator.truediv, x, y)

    # ---- the walk --------------------------------------------------------------------------

    def run(self, graph, full_xs, extra):
        nodes = list(graph.nodes)
        placeholders = [n for n in nodes if n.op == "placeholder"]
        output = next(n for n in nodes if n.op == "output")
        if len(placeholders) != 1 + len(full_xs) + len(extra):
            _fail(f"{self.where}: takes {len(placeholders)} inputs, the scan passes "
                  f"{1 + len(full_xs) + len(extra)}")
        self.carry = placeholders[0]
        self.vals[self.carry] = _Aff(1, 0)
        for ph, x in zip(placeholders[1:], full_xs):
            self.vals[ph] = (self.sequence(x, ph), True)
        for ph, e in zip(placeholders[1 + len(full_xs):], extra):
            self.vals[ph] = e if isinstance(e, (int, float)) else (e, False)
        results = list(output.args[0])
        new, ys = results[0], results[1:]
        # the new carry first (its ancestors), then the scan, then what the ys still need
        for n in _ancestors([new], nodes):
            self.visit(n)
        states, last = self.scan(self.vals[new] if hasattr(new, "op") else new, bool(ys))
        for n in _ancestors(ys, nodes):
            if n not in self.vals:
                self.visit(n)
        return [last] + [self.stacked(y, i) for i, y in enumerate(ys)]

    def sequence(self, x, ph):
        """The full scanned input ``x`` (L first) with its slice dims left-padded to the
        carry's rank, so that it broadcasts like the per-step slice does."""
        shape = _static(x, f"{self.where}: scanned input '{ph.name}'")
        if len(shape) - 1 > self.rank:
            _fail(f"{self.where}: a slice of '{ph.name}' has rank {len(shape) - 1}, more than "
                  f"the carry's {self.rank}")
        pad = self.rank + 1 - len(shape)
        return self.emit(relax.op.expand_dims(x, list(range(1, 1 + pad)))) if pad else x

    def value(self, arg):
        if hasattr(arg, "op"):  # an fx.Node
            return self.vals[arg]
        return arg

    def visit(self, n):
        if n.op == "placeholder":
            return
        what = f"{self.where}: node '{n.name}' ({_op_name(n)})"
        if n.op != "call_function":
            _fail(f"{what}: {n.op} nodes are not supported in a combine function")
        inputs = n.all_input_nodes
        vals = [self.vals[i] for i in inputs]
        if any(isinstance(v, _Aff) for v in vals):
            if not self.scanned:
                self.vals[n] = self.affine(n, what)
                return
            # after the scan (ys only): the previous carry is a known sequence
            for i, v in zip(inputs, vals):
                if isinstance(v, _Aff):
                    self.vals[i] = self.materialize(v)
        try:
            self.vals[n] = self.convert(n, what)
        except UnsupportedScan:
            raise
        except Exception as err:  # pylint: disable=broad-except  # a TVM converter failed
            raise UnsupportedScan(f"{what}: {type(err).__name__}: {err}") from err

    def convert(self, n, what):
        """An op on per-step and/or invariant values, by TVM's own converter."""
        name = _op_name(n)
        inputs = n.all_input_nodes
        varying = any(isinstance(self.vals[i], tuple) and self.vals[i][1] for i in inputs)
        if varying and name not in ELEMENTWISE:
            _fail(f"{what}: {_short(n)} is not elementwise, so it cannot run on the whole "
                  "sequence at once")
        if getattr(n.target, "__module__", "") == "torch.ops.higher_order" \
                or name not in self.imp.convert_map:
            _fail(f"{what}: {name} is not supported inside a scan combine function")
        env = {}
        for i in inputs:
            v = self.vals[i]
            env[i] = self.lift(v, varying) if isinstance(v, tuple) else v
        saved, self.imp.env = self.imp.env, env
        try:
            out = self.imp.convert_map[name](n)
        finally:
            self.imp.env = saved
        if not isinstance(out, relax.Expr):
            if varying:
                _fail(f"{what}: does not produce a tensor")
            return out
        return (self.emit(out), varying)

    def affine(self, n, what):
        """Propagate a*h + b through op ``n`` with a carry-dependent operand, or refuse."""
        name = _op_name(n)
        args = [self.value(a) for a in n.args]
        aff = [a for a in args if isinstance(a, _Aff)]
        f = [a if isinstance(a, _Aff) else _Aff(0, a) for a in args]
        alpha = n.kwargs.get("alpha", 1)
        if name in _IDENTITY and len(aff) == 1 and args[0] is aff[0]:
            dtype = n.kwargs.get("dtype")
            if dtype is not None and str(dtype).replace("torch.", "") != str(self.dtype):
                _fail(f"{what}: casts the carry to {dtype}: not affine in the carry")
            return aff[0]
        if name == "neg.default":
            return _Aff(self.mul(f[0].a, -1), self.mul(f[0].b, -1))
        if name in ("add.Tensor", "add.Scalar", "sub.Tensor", "sub.Scalar",
                    "rsub.Tensor", "rsub.Scalar") and len(args) == 2:
            x, y = f
            if name.startswith("rsub"):  # other - alpha*self
                x, y = y, x
                y = _Aff(self.mul(y.a, alpha), self.mul(y.b, alpha))
            elif not _is(alpha, 1):
                y = _Aff(self.mul(y.a, alpha), self.mul(y.b, alpha))
            sign = 1 if name.startswith("add") else -1
            return _Aff(self.add(x.a, y.a, sign), self.add(x.b, y.b, sign))
        if name in ("mul.Tensor", "mul.Scalar") and len(args) == 2:
            if len(aff) == 2:
                _fail(f"{what}: multiplies two carry-dependent values (h*h, or a coefficient "
                      "computed from the carry): not affine in the carry")
            h, c = args if isinstance(args[0], _Aff) else args[::-1]
            self.check_coefficient(c, what)
            return _Aff(self.mul(h.a, c), self.mul(h.b, c))
        if name in ("div.Tensor", "div.Scalar") and len(args) == 2 and not n.kwargs \
                and not isinstance(args[1], _Aff):
            self.check_coefficient(args[1], what)
            return _Aff(self.div(f[0].a, args[1]), self.div(f[0].b, args[1]))
        if name.startswith("div") and isinstance(args[-1], _Aff):
            return _fail(f"{what}: divides by the carry: not affine in the carry")
        only = ("only an elementwise h*a + b (add, sub, mul and div by carry-free values, neg, "
                "clone) converts to a scan")
        if name not in ELEMENTWISE:
            return _fail(f"{what}: {_short(n)}(h) is not an elementwise op on the carry; {only}")
        return _fail(f"{what}: {_short(n)}(h) is not affine in the carry; {only}")

    def check_coefficient(self, c, what):
        if not isinstance(c, (int, float)) and str(c[0].ty.dtype) != str(self.dtype):
            _fail(f"{what}: a coefficient of dtype {c[0].ty.dtype} on a carry of {self.dtype}")

    # ---- the scan and its outputs ----------------------------------------------------------

    def scan(self, v, with_states):
        """Emit the scan of the new carry ``v``; returns (states, last)."""
        new = v
        if not isinstance(v, _Aff):
            v = _Aff(0, v)  # h = b: a is 0
        full = (self.length,) + self.state_shape
        a, b = self.lift(v.a, True), self.lift(v.b, True)
        shapes = {}
        for name, t in (("a", a), ("b", b)):
            shape = shapes[name] = _static(t, self.where)
            if str(t.ty.dtype) != str(self.dtype):
                _fail(f"{self.where}: {name} of the update h = a*h + b is {t.ty.dtype}, the "
                      f"carry {self.dtype}")
            if len(shape) > len(full) or any(m not in (1, k) for m, k in zip(shape[::-1], full[::-1])):
                _fail(f"{self.where}: {name} of the update h = a*h + b has shape {shape[1:]} "
                      f"per step, which does not broadcast to the carry's {self.state_shape}")
        if len(shapes["a"]) < len(full):
            a = self.emit(relax.op.reshape(a, (1,) * (len(full) - len(shapes["a"])) + shapes["a"]))
        if shapes["b"] != full:
            b = self.emit(relax.op.broadcast_to(b, full))
        kinds = ("states", "last") if with_states else ("last",)
        try:
            spec = AffineScanSpec.create(full, _static(a, self.where), 0, False, True,
                                         str(self.dtype), kinds)
        except ValueError as err:
            _fail(f"{self.where}: {err}")
        call = self.emit(make_scan(spec, [a, b, self.h0]))
        if not with_states:
            return None, call
        states = self.emit(relax.TupleGetItem(call, 0))
        last = self.emit(relax.TupleGetItem(call, 1))
        # every alias of the new carry is now the sequence of states
        for k, val in list(self.vals.items()):
            if val is new and k is not self.carry:  # h.clone() as the new carry: h stays h
                self.vals[k] = (states, True)
        self.states, self.scanned = states, True
        return states, last

    def materialize(self, v):
        """An affine function of the previous carry as a whole sequence: a*h_{t-1} + b."""
        if id(v) in self.materialized:
            return self.materialized[id(v)][1]
        if self.prev is None:
            h0 = self.emit(relax.op.expand_dims(self.h0, [0]))
            if self.length == 1:
                self.prev = h0
            else:
                head = self.emit(relax.op.strided_slice(self.states, [0], [0], [self.length - 1]))
                self.prev = self.emit(relax.op.concat([h0, head], axis=0))
        out = self.add(self.mul(v.a, (self.prev, True)), v.b)
        self.materialized[id(v)] = (v, out)  # v kept alive: its id stays unique
        return out

    def stacked(self, y, i):
        """The stacked ys output ``y``: shape (L, *y_t's shape)."""
        what = f"{self.where}: output y{i}"
        v = self.value(y)
        if isinstance(v, _Aff):
            v = self.materialize(v)
        val = getattr(y, "meta", {}).get("val")
        if isinstance(v, (int, float)):
            v = (relax.const(v, str(val.dtype).replace("torch.", "") if val is not None
                             else self.dtype), False)
        expr, varying = v
        shape = _static(expr, what)
        if val is not None:
            try:
                target = (self.length,) + tuple(int(d) for d in val.shape)
            except TypeError:
                _fail(f"{what}: needs a static shape, got {tuple(val.shape)}")
        else:
            target = (self.length,) + (shape[1:] if varying else shape)
        if not varying:
            expr = self.emit(relax.op.expand_dims(expr, [0]))
            shape = (1,) + shape
        if shape == target:
            return expr
        if math.prod(shape) != math.prod(target):
            padded = (1,) * (len(shape) - len(target)) + target
            if len(padded) != len(shape):
                _fail(f"{what}: shape {shape[1:]} per step does not match {target[1:]}")
            expr = self.emit(relax.op.broadcast_to(expr, padded))
        return self.emit(relax.op.reshape(expr, target))


def _ancestors(roots, nodes):
    """The nodes among ``nodes`` that ``roots`` depend on (roots included), in graph order."""
    need, stack = set(), [r for r in roots if hasattr(r, "op")]
    while stack:
        n = stack.pop()
        if n not in need:
            need.add(n)
            stack.extend(n.all_input_nodes)
    return [n for n in nodes if n in need]
