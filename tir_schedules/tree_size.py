"""How large a PrimFunc is when written out as a tree: what TVM's TIR passes and its LLVM codegen
walk, and the measure a schedule rule's output is bounded by (``cpu_rule``).

Scheduling primitives share subexpressions: ``compute_inline`` puts the producer's value object
into each place its consumer reads it, so the function stays small in memory (a DAG).  TVM's
passes walk and rebuild it as a tree, and a chain of stages each reading the one before twice is
``2**stages`` nodes to them: a GRU step ``h = tanh(x) + h * (w * sigmoid(h))`` over 17 steps,
inlined into the ``concat`` of its outputs, is a 16 MB script and a TIR build that does not
finish.  LLVM's intrinsic rule lowers ``tanh(x)`` to ``select(x >= 0, (1 - e(-2x)) / (1 +
e(-2x)), (e(2x) - 1) / (e(2x) + 1))``, three uses of ``x``, so a plain ``tanh(a * h + b)`` RNN
grows as ``3**steps``.  ``tree_size`` counts the tree in time linear in the DAG.
"""
import tvm_ffi

# Calls whose lowering reads each argument more than once (LLVM's intrinsic rules).
ARGUMENT_USES = {"tirx.tanh": 3}

# Fields that hold no expression the passes rewrite: names, types, buffers, declarations.
_SKIPPED = frozenset({"span", "ty", "dtype", "buffer", "name_hint", "alloc_buffers", "match_buffers",
                      "reads", "writes", "iter_vars", "annotations", "loop_var", "thread_binding",
                      "source", "op", "attrs", "ty_args", "kind", "params", "buffer_map", "ret_type"})

_FIELDS = {}


def _fields(node_type):
    """The names of ``node_type``'s fields (its own and its ancestors'), cached per type."""
    if node_type not in _FIELDS:
        names, info = [], getattr(node_type, "__tvm_ffi_type_info__", None)
        while info is not None:
            names += [f.name for f in info.fields if f.name not in _SKIPPED]
            info = info.parent_type_info
        _FIELDS[node_type] = tuple(names)
    return _FIELDS[node_type]


def tree_size(node, loads=None):
    """The number of nodes of ``node`` (a PrimFunc, statement or expression) written out as a
    tree, calls in ``ARGUMENT_USES`` counting their arguments that many times, and a load of a
    buffer in ``loads`` (its handle -> a size) counting that size.  Iterative: an unrolled chain
    nests deeper than Python's recursion limit."""
    memo = {}
    for obj in _loads_of(node, loads or {}):
        memo[obj.__chandle__()] = loads[obj.source.__chandle__()]
    root = getattr(node, "body", node)
    stack = [(root, False)]
    while stack:
        obj, expanded = stack.pop()
        key = obj.__chandle__()
        if key in memo:
            continue
        children = [c for name in _fields(type(obj)) for c in _objects(getattr(obj, name))]
        if not expanded:
            stack.append((obj, True))
            stack.extend((c, False) for c in children if c.__chandle__() not in memo)
            continue
        below = sum(memo[c.__chandle__()] for c in children)
        op = getattr(obj, "op", None)
        memo[key] = 1 + below * (ARGUMENT_USES.get(getattr(op, "name", None), 1) if op is not None else 1)
    return memo[root.__chandle__()]


def inlined_size(func, size=None):
    """``tree_size`` of ``func`` once every stage that writes an intermediate buffer (a plain
    store, no reduction) is inlined into its readers, as DLight's ``try_inline`` and our rules'
    ``compute_inline`` do; found before inlining, which itself takes time in what it writes.
    ``size``: ``tree_size(func)`` where the caller has it already."""
    size = tree_size(func) if size is None else size
    try:
        root = func.body.block
    except AttributeError:
        return size
    intermediate = {b.__chandle__() for b in root.alloc_buffers}
    blocks = _blocks(root)
    sizes, total = {}, size - sum(tree_size(b) for b in blocks)
    for block in blocks:
        written = block.writes[0].source.__chandle__() if len(block.writes) == 1 else None
        if written in intermediate and block.init is None and type(block.body).__name__ == "BufferStore":
            sizes[written] = tree_size(block.body.value, sizes)
        else:
            total += tree_size(block, sizes)
    return total


def _blocks(root):
    """The blocks directly under ``root``, in order (through its loops and sequences)."""
    found, todo = [], [root.body]
    while todo:
        stmt = todo.pop()
        kind = type(stmt).__name__
        if kind == "SBlockRealize":
            found.append(stmt.block)
        elif kind == "SeqStmt":
            todo.extend(reversed(list(stmt.seq)))
        elif hasattr(stmt, "body"):
            todo.append(stmt.body)
    return found


def _loads_of(node, loads):
    """The loads under ``node`` of the buffers in ``loads`` (none when ``loads`` is empty)."""
    if not loads:
        return []
    found, seen, todo = [], set(), [getattr(node, "body", node)]
    while todo:
        obj = todo.pop()
        key = obj.__chandle__()
        if key in seen:
            continue
        seen.add(key)
        if type(obj).__name__ == "TensorLoad" and obj.source.__chandle__() in loads:
            found.append(obj)
            continue
        todo.extend(c for name in _fields(type(obj)) for c in _objects(getattr(obj, name)))
    return found


def _objects(value):
    """The nodes in a field's value: the node itself, or an Array's nodes."""
    if isinstance(value, tvm_ffi.Array):
        return [x for x in value if isinstance(x, tvm_ffi.Object)]
    return [value] if isinstance(value, tvm_ffi.Object) else []
