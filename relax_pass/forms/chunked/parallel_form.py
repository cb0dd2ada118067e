"""Matrix scans in their parallel (quadratic) form: ``o = ((q k^T) * M) v`` over the whole
sequence, with ``M`` a causal decay mask (retention's ``gamma^(t-s)`` for ``t >= s``, fla's
``naive_retention``; linear attention's ``tril``; or ``exp(G_t - G_s)`` from a cumsum ``G``).

The region is found by its shape: the (L, L) tensors an output is computed from, back to the
tensors with one time axis that they are computed from (q, k, v, a log-decay: a cumsum or a
broadcast of one is read through).  It is a candidate only when it multiplies by a constant
causal (lower-triangular) mask and holds no softmax; ``chunked.match_region`` then names the
operands' roles against the oracle like any chunked region (a constant decay per head is read
off the output).
"""
import numpy as np

from scanweaver_core.exprs import VarMap, op_name, tensor_shape

from ...interpret import EVAL_ERRORS, Interpreter

READ_THROUGH = ("relax.cumsum", "relax.expand_dims")     # a log-decay's cumsum, its broadcasts
NOT_A_SCAN = ("relax.nn.softmax", "relax.nn.log_softmax", "relax.max", "relax.argmax")


def _count(shape, n):
    return 0 if shape is None else sum(1 for d in shape if d == n)


def _causal(value, n):
    """A constant causal mask over its first two dims of extent ``n`` (query, then key): zero
    (False, -inf) strictly above the diagonal and not all zero below, or the converse (what
    ``masked_fill`` and ``where`` fill: ``~tril``)."""
    x = np.asarray(value)
    axes = [d for d, m in enumerate(x.shape) if m == n][:2]
    x = np.moveaxis(x, axes, (-2, -1))
    upper = np.triu(np.ones(x.shape[-2:], dtype=bool), 1)
    zero = (x == 0) | np.isneginf(x) if x.dtype != bool else ~x
    return bool(np.all(zero[..., upper]) != np.all(zero[..., ~upper]))


def parallel_regions(facts, views):
    """``[(exit var, time axis, length, operands)]``: each binding that reads a non-constant
    (L, L) tensor and is not one, whose (L, L) region multiplies by a constant causal mask;
    ``operands`` are ``[(var, time axis)]``.  ``views`` are block views (chunked or sliced
    entries): a region reading one is a chunk's inner part, left to ``chunked``."""
    found, masks = [], VarMap()
    for b in facts.bindings:
        shape = tensor_shape(b.var)
        if shape is None:
            continue
        reads = [r for r in facts.reads[b.var] if tensor_shape(r) is not None and not facts.constant(r)]
        lengths = [n for r in reads for n in sorted(set(tensor_shape(r)))
                   if n >= 2 and _count(tensor_shape(r), n) >= 2 and _count(shape, n) == 1]
        if not lengths:
            continue
        length = lengths[0]
        squares = [r for r in reads if _count(tensor_shape(r), length) >= 2]
        walked = _walk(facts, squares, length)
        if walked is None:
            continue
        operands, constants = walked
        for r in reads:                      # what the exit reads besides them: v
            while _flattened(facts, r):
                r = facts.value[r].args[0]
            if _count(tensor_shape(r), length) == 1 and not any(r.same_as(o) for o, _ in operands):
                operands.append((r, tensor_shape(r).index(length)))
        if any(v in views for v, _ in operands):
            continue
        if not any(_is_causal_mask(facts, c, length, masks) for c in constants):
            continue
        exit_var = _unflattened(facts, b.var)
        found.append((exit_var, tensor_shape(exit_var).index(length), length, operands))
    return found


def _merges_leading(inner, outer):
    """``outer`` is ``inner`` with its leading dims merged into one (what the frontend's
    ``matmul`` of 4-D operands does: (B, H, L, .) as (B*H, L, .)); the last two kept."""
    return (inner is not None and outer is not None and 3 <= len(outer) < len(inner)
            and tuple(outer[1:]) == tuple(inner[len(inner) - len(outer) + 1:])
            and outer[0] == int(np.prod(inner[:len(inner) - len(outer) + 1])))


def _unflattened(facts, var):
    """The one reshape that splits ``var``'s merged leading dims back, when that is its only
    use (the exit is then read in the layout the model has); else ``var``."""
    users = facts.users.get(var, [])
    if len(users) == 1 and users[0] != "return" and op_name(facts.value[users[0]]) == "relax.reshape" \
            and _merges_leading(tensor_shape(users[0]), tensor_shape(var)):
        return users[0]
    return var


def _flattened(facts, var):
    """``var`` is its operand with the leading dims merged (a reshape, through a
    ``broadcast_to``): read through, the operand keeps its batch and head dims."""
    val = facts.value.get(var)
    if op_name(val) == "relax.broadcast_to":
        return True
    return op_name(val) == "relax.reshape" and _merges_leading(tensor_shape(val.args[0]), tensor_shape(var))


def _walk(facts, squares, length):
    """What the (L, L) region back from ``squares`` reads: ``([(operand, time axis)], constant
    (L, L) tensors)``, or None when it holds a softmax or an operand's time axis is ambiguous."""
    region, operands, constants = VarMap(), [], []
    stack = list(squares)
    while stack:
        v = stack.pop()
        if v in region or any(v.same_as(o) for o, _ in operands):
            continue
        if facts.constant(v):
            if _count(tensor_shape(v), length) >= 2 and v not in constants:
                constants.append(v)
            continue
        val = facts.value.get(v)
        shape = tensor_shape(v)
        if val is not None and (_count(shape, length) >= 2 or op_name(val) in READ_THROUGH
                                or _flattened(facts, v)):
            if op_name(val) in NOT_A_SCAN:
                return None
            region[v] = True
            stack.extend(facts.reads[v])
            continue
        axes = [] if shape is None else [d for d, n in enumerate(shape) if n == length]
        if len(axes) != 1:
            return None
        operands.append((v, axes[0]))
    return operands, constants


def _is_causal_mask(facts, var, length, memo):
    if var not in memo:
        try:
            memo[var] = _causal(Interpreter(facts.value)(var), length)
        except EVAL_ERRORS:
            memo[var] = False
    return memo[var]
