"""How a graph gathers per-step values into one tensor, for the matrix matcher.

PyTorch loops collect each step's value in a list and ``torch.stack``/``cat`` it (a ``concat``,
sometimes followed by a reshape), or write it in place, ``o[:, :, t] = x_t``, which exports as
one ``where(arange == t, x_t, o)`` per step over the whole buffer (``torch.export``) or one
``scatter_nd(o, indices, x_t)`` per step (ONNX's ScatterND).  ``stack_sources`` yields each
such gathering with a check that it is exactly a stack in time of given values.
"""
import numpy as np
from tvm import relax

from scanweaver_core.exprs import VarMap

from ...interpret import EVAL_ERRORS, Interpreter
from ...steps import op_name, tensor_shape


def stack_sources(value_of, users, length):
    """``(var, fields, stack)`` for each way the graph gathers per-step values: a ``concat``
    (``torch.stack``/``cat`` of a list), or a chain of in-place writes ``o[:, :, t] = x_t``
    (exported as one ``where(arange == t, x_t, o)`` per step over the whole buffer).
    ``stack(values)`` gives ``(stacked var, time axis, bindings it replaces)`` when the
    gathered values are exactly ``values`` stacked in time, else None."""
    for cat, call in value_of.items():
        if op_name(call) == "relax.concat" and isinstance(call.args[0], relax.Tuple):
            fields = list(call.args[0].fields)

            def stack(_values, cat=cat, fields=fields):
                found = _stack(value_of, users, cat, fields, length)
                return None if found is None else (*found, {cat, found[0]})
            yield cat, fields, stack
    for last, chain, op in _write_chains(value_of, users, length):
        fields = [_written_value(value_of, value_of[w].args[WRITES[op][1]]) for w in chain]
        yield last, fields, lambda values, last=last, chain=chain, op=op: _written(
            value_of, last, chain, values, WRITES[op][0])


# an in-place write op -> (its buffer's argument, its value's argument)
WRITES = {"relax.where": (2, 1), "relax.scatter_nd": (0, 2)}


def _write_chains(value_of, users, length):
    """The chains of writes (``where`` or ``scatter_nd``) into one buffer with an axis of
    ``length``: ``(last, [first .. last], op)`` for each last write (no write of its kind and
    shape uses it)."""
    for w, call in value_of.items():
        shape, op = tensor_shape(w), op_name(call)
        if op not in WRITES or shape is None or length not in shape:
            continue
        if any(op_name(value_of.get(u)) == op and tensor_shape(u) == shape
               for u in users.get(w, []) if isinstance(u, relax.Var)):
            continue
        chain, x = [], w
        while isinstance(x, relax.Var) and op_name(value_of.get(x)) == op and tensor_shape(x) == shape:
            chain.append(x)
            x = value_of[x].args[WRITES[op][0]]
        if len(chain) >= 2:
            yield w, chain[::-1], op


def _written_value(value_of, x):
    """What a write puts in its slot: below the broadcast (and unit dims) that spread it over
    the whole buffer or shape it as the slot."""
    while isinstance(x, relax.Var):
        call = value_of.get(x)
        name = op_name(call)
        if name == "relax.reshape" and not _unit_reshape(call):
            break
        if name not in ("relax.broadcast_to", "relax.expand_dims", "relax.reshape"):
            break
        x = call.args[0]
    return x


def _unit_reshape(call):
    inner, outer = tensor_shape(call.args[0]), tensor_shape(call)
    return inner is not None and outer is not None and \
        [n for n in inner if n != 1] == [n for n in outer if n != 1]


def _written(value_of, last, chain, written, buffer_arg=2):
    """``(last, axis, bindings)`` when the writes leave the ``written`` values stacked along
    ``axis`` in time order, every slot written (checked on random values and a random
    initial buffer), else None."""
    rng = np.random.default_rng(13)
    shape = tensor_shape(last)
    env = VarMap((x, rng.standard_normal(tensor_shape(x))) for x in written)
    first_buffer = value_of[chain[0]].args[buffer_arg]
    interp = Interpreter(value_of, missing=lambda var: rng.standard_normal(tensor_shape(var) or ()))
    interp.memo.update(env)
    if isinstance(first_buffer, relax.Var):
        interp.memo[first_buffer] = rng.standard_normal(shape)
    try:
        got = interp(last)
    except EVAL_ERRORS:
        return None
    values = [env[x] for x in written]
    for axis, n in enumerate(shape):
        if n == len(values) and all(np.take(got, t, axis=axis).size == v.size and
                                    np.array_equal(np.take(got, t, axis=axis).reshape(v.shape), v)
                                    for t, v in enumerate(values)):
            return last, axis, {x for x in interp.memo if x not in env and not x.same_as(first_buffer)}
    return None


def _stack(value_of, users, cat, fields, length):
    """``(var, time axis)`` of the stack ``cat`` makes of ``fields``: a concat of pieces with a
    unit dim at the axis, or of whole pieces followed by a reshape splitting that axis into
    (L, piece extent); None otherwise."""
    shape, piece = tensor_shape(cat), tensor_shape(fields[0])
    if shape is None or piece is None or any(tensor_shape(f) != piece for f in fields):
        return None
    axis = int(value_of[cat].attrs.axis) % len(shape)
    if piece[axis] == 1:
        return cat, axis
    found = users.get(cat, [])
    split = piece[:axis] + (length,) + piece[axis:]
    if len(found) == 1 and isinstance(found[0], relax.Var) and \
            op_name(value_of.get(found[0])) == "relax.reshape" and tensor_shape(found[0]) == split:
        return found[0], axis
    return None
