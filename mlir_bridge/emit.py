"""A small structured MLIR emitter: values, ops, blocks, regions, printed in generic form.

Every stage builds IR through this one builder, so SSA names, types and attribute syntax are
produced in one place and a stage never concatenates IR strings itself.  The op tree is also
what the CPU route transforms (``stage_cpu``), so ops keep their operands as ``Value`` objects.
Generic form (``"dialect.op"(%x) <{props}> ({region}) {attrs} : (types) -> (types)``) is
accepted by ``mlir-opt`` for every dialect, IRDL ones included.
"""
from contextlib import contextmanager


class Value:
    """An SSA value: a printed name and its MLIR type (text)."""

    def __init__(self, name, type_):
        self.name, self.type = name, type_

    def __repr__(self):
        return f"{self.name} : {self.type}"


class Block:
    def __init__(self, args=()):
        self.args, self.ops = list(args), []


class Op:
    """One operation; ``props``/``attrs`` map names to attribute text (see ``attr_*``)."""

    def __init__(self, name, operands, results, props=None, attrs=None, regions=()):
        self.name, self.operands, self.results = name, list(operands), list(results)
        self.props, self.attrs, self.regions = dict(props or {}), dict(attrs or {}), list(regions)

    def walk(self):
        yield self
        for region in self.regions:
            for block in region:
                for op in block.ops:
                    yield from op.walk()


# --- attribute text ---------------------------------------------------------------------

def attr_int(value, type_="i64"):
    return f"{int(value)} : {type_}"


def attr_bool(value):
    return "true" if value else "false"


def attr_float(value, type_="f32"):
    return f"{float(value)!r} : {type_}".replace("inf", "0x7F800000")


def attr_str(value):
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def attr_sym(name):
    return f"@{name}"


def attr_array(items):
    return "[" + ", ".join(items) + "]"


def attr_dense(values, type_="i64"):
    return f"array<{type_}" + (": " + ", ".join(str(int(v)) for v in values) if values else "") + ">"


def attr_dict(items):
    return "{" + ", ".join(f"{k} = {v}" for k, v in items.items()) + "}"


# --- types ------------------------------------------------------------------------------

MLIR_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def tensor_type(shape, elem):
    return "tensor<" + "".join(("?" if n is None else str(n)) + "x" for n in shape) + elem + ">"


def memref_type(shape, elem, space=None):
    dims = "".join(("?" if n is None else str(n)) + "x" for n in shape)
    return f"memref<{dims}{elem}" + (f", {space}" if space else "") + ">"


def func_type(inputs, outputs):
    outs = ", ".join(outputs)
    return "(" + ", ".join(inputs) + ") -> " + (f"({outs})" if len(outputs) != 1 else outs)


# --- the builder ------------------------------------------------------------------------

class Builder:
    """Creates ops at an insertion point; ``region()`` opens a nested block."""

    def __init__(self):
        self._count = 0
        self._blocks = []
        self._consts = {}

    def fresh(self, type_, hint="v"):
        self._count += 1
        return Value(f"%{hint}{self._count}", type_)

    @contextmanager
    def block(self, arg_types=(), hints=None):
        """A new block (yielded with its args) that ops go into until the context ends."""
        blk = Block([self.fresh(t, (hints or {}).get(i, "arg")) for i, t in enumerate(arg_types)])
        self._blocks.append(blk)
        try:
            yield blk
        finally:
            self._blocks.pop()

    def append(self, op):
        self._blocks[-1].ops.append(op)
        return op

    def op(self, name, operands=(), result_types=(), props=None, attrs=None, regions=(), hint="v"):
        """Create an op; returns its single result, a list of results, or the op if none."""
        results = [self.fresh(t, hint) for t in result_types]
        op = self.append(Op(name, operands, results, props, attrs, regions))
        if len(results) == 1:
            return results[0]
        return results if results else op

    # constants live in the outermost open block (the function entry), cached by value
    def const(self, value, type_):
        key = (repr(value), type_, id(self._blocks[0]))
        if key not in self._consts:
            text = attr_int(value, type_) if type_ in ("index", "i1", "i32", "i64") \
                else attr_float(value, type_)
            res = self.fresh(type_, "c")
            self._blocks[0].ops.insert(0, Op("arith.constant", [], [res], {"value": text}))
            self._consts[key] = res
        return self._consts[key]

    def index(self, value):
        return self.const(value, "index")

    def f32(self, value):
        return self.const(float(value), "f32")

    # arithmetic helpers (operands must share a type)
    def binary(self, name, x, y):
        return self.op(f"arith.{name}", [x, y], [x.type])

    def add(self, x, y):
        return self.binary("addf" if x.type.startswith(("f", "b")) else "addi", x, y)

    def mul(self, x, y):
        return self.binary("mulf" if x.type.startswith(("f", "b")) else "muli", x, y)

    def sub(self, x, y):
        return self.binary("subf" if x.type.startswith(("f", "b")) else "subi", x, y)

    def cmpi(self, pred, x, y):
        preds = {"eq": 0, "ne": 1, "slt": 2, "sle": 3, "sgt": 4, "sge": 5,
                 "ult": 6, "ule": 7, "ugt": 8, "uge": 9}
        return self.op("arith.cmpi", [x, y], ["i1"], {"predicate": attr_int(preds[pred])})

    def cmpf(self, pred, x, y):
        preds = {"ogt": 2, "olt": 4}
        return self.op("arith.cmpf", [x, y], ["i1"], {"predicate": attr_int(preds[pred])})

    def select(self, cond, x, y):
        return self.op("arith.select", [cond, x, y], [x.type])

    def math(self, name, x):
        return self.op(f"math.{name}", [x], [x.type])

    def to_f32(self, x):
        return x if x.type == "f32" else self.op("arith.extf", [x], ["f32"])

    def from_f32(self, x, elem):
        return x if elem == "f32" else self.op("arith.truncf", [x], [elem])

    def index_cast(self, x, type_):
        return self.op("arith.index_cast", [x], [type_])

    def load(self, ref, idx):
        elem = ref.type.rsplit("x", 1)[1].split(",")[0].rstrip(">")
        return self.op("memref.load", [ref, *idx], [elem])

    def store(self, value, ref, idx):
        self.op("memref.store", [value, ref, *idx])

    @contextmanager
    def for_(self, lo, hi, step=None):
        """``scf.for`` without iter_args; yields the induction variable."""
        region = []
        with self.block(["index"], {0: "i"}) as body:
            region.append(body)
            yield body.args[0]
            self.op("scf.yield")
        self.op("scf.for", [lo, hi, step or self.index(1)], regions=[region])

    @contextmanager
    def if_(self, cond):
        region = []
        with self.block() as body:
            region.append(body)
            yield
            self.op("scf.yield")
        self.op("scf.if", [cond], regions=[region, []])


# --- printing ---------------------------------------------------------------------------

def print_op(op, indent=0):
    pad = "  " * indent
    lhs = ", ".join(r.name for r in op.results)
    text = pad + (lhs + " = " if lhs else "") + f'"{op.name}"(' \
        + ", ".join(v.name for v in op.operands) + ")"
    if op.props:
        text += " <" + attr_dict(op.props) + ">"
    if op.regions:
        text += " (" + ", ".join(_print_region(r, indent) for r in op.regions) + ")"
    if op.attrs:
        text += " " + attr_dict(op.attrs)
    outs = [r.type for r in op.results]
    text += " : (" + ", ".join(v.type for v in op.operands) + ") -> " \
        + ("(" + ", ".join(outs) + ")" if len(outs) != 1 else outs[0])
    return text


def _print_region(region, indent):
    if not region:
        return "{\n" + "  " * indent + "}"
    lines = ["{"]
    for blk in region:
        if blk.args:
            lines.append("  " * (indent + 1) + "^bb0(" + ", ".join(f"{a.name}: {a.type}" for a in blk.args) + "):")
        lines.extend(print_op(o, indent + 2) for o in blk.ops)
    lines.append("  " * indent + "}")
    return "\n".join(lines)


def module(ops, attrs=None):
    """A ``builtin.module`` op around top-level ops, printed."""
    blk = Block()
    blk.ops = list(ops)
    return print_op(Op("builtin.module", [], [], attrs=attrs, regions=[[blk]]))


def func(b, name, arg_types, result_types, body, op_name="func.func", attrs=None, hints=None):
    """Build a function op: ``body(args)`` emits the ops (and the terminator)."""
    region = []
    with b.block(arg_types, hints) as entry:
        region.append(entry)
        body(entry.args)
    props = {"function_type": func_type(arg_types, result_types)}
    attrs = dict(attrs or {})
    if op_name == "func.func":        # func.func keeps these as properties, gpu.func as attributes
        props["sym_name"] = attr_str(name)
        if "sym_visibility" in attrs:
            props["sym_visibility"] = attrs.pop("sym_visibility")
    else:
        attrs["sym_name"] = attr_str(name)
    return Op(op_name, [], [], props, attrs, [region])
