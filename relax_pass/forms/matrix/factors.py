"""The per-step input and decay of a matrix chain read as factors (``matrix.py``,
``matrix_lifted.py``): ``b_t`` as a product of views (``multiply``, ``einsum`` or ``matmul``
contracting nothing) whose factors get batch/head/K/V labels by their values, exactly one over
K (``k_t``); ``a_t`` over the lanes, or also over K or over V."""
import itertools
import string
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from ...narrow import expr_shape, narrowed, non_unit
from ...operands import evaluate_from, widening
from ...steps import ONE, op_name, tensor_shape

ASSIGNMENTS = 4096      # label assignments tried for one product's factors
_VIEWS = ("relax.expand_dims", "relax.squeeze", "relax.reshape", "relax.broadcast_to",
          "relax.permute_dims")


@dataclass
class Factor:
    """A per-step (or invariant) value of the step: ``expr`` and, for each of its non-unit
    axes in order, the state dim it runs along."""
    expr: object
    labels: tuple


def input_and_decay(b, a, shape, dtype, key, labels, value_of, rng, lanes_from=None):
    """``(roles, k Factor, other factors, decay Factor or None)`` of a step ``S = a*S + b``
    over a state of ``shape`` whose readout contracts dim ``key``, or a reason.  The last
    non-unit dim other than K is V, the rest are lanes (``lanes_from``: the dims that may
    be lanes, default all)."""
    rest = [d for d in labels if d != key and (lanes_from is None or d in lanes_from)]
    if not rest:
        return "the state has no dim besides the contracted one: not a matrix per lane"
    value_dim, lanes = rest[-1], rest[:-1]
    if len(lanes) > 2:
        return f"the state has {len(lanes)} lane dims besides K and V (at most 2: batch, head)"
    roles = {"K": key, "V": value_dim, **dict(zip(("B", "H"), lanes))}
    product = _product(b, shape, dtype, value_of, labels, rng)
    if isinstance(product, str):
        return product
    keyed = [f for f in product if key in f.labels]
    if len(keyed) != 1 or value_dim in keyed[0].labels:
        return "b_t is not an outer product k_t v_t^T of a key vector and a value vector"
    others = [f for f in product if f is not keyed[0]]
    if not any(value_dim in f.labels for f in others):
        return "b_t has no factor over the value dim"
    decay = _decay(a, shape, roles, value_of)
    if isinstance(decay, str):
        return decay
    return roles, keyed[0], others, decay


# -- the input and the decay ---------------------------------------------------------------------
def _product(b, shape, dtype, value_of, labels, rng):
    """``b``'s factors (``Factor``s), checked: ``b`` equals their product on random values.
    The factors are read through every layout view first; when that fails, without going
    below a reshape that regroups dims (a factor repeated from groups to heads,
    ``B.expand(b, g, h // g, n).reshape(b, h, n)``, is one over the heads)."""
    first = _product_of(b, shape, dtype, value_of, labels, rng, _product_leaves(value_of, b))
    if not isinstance(first, str):
        return first
    leaves, through = _product_leaves(value_of, b, regroup=False), _product_leaves(value_of, b)
    if len(leaves) == len(through) and all(x.same_as(y) for x, y in zip(leaves, through)):
        return first
    found = _product_of(b, shape, dtype, value_of, labels, rng, leaves)
    return first if isinstance(found, str) else found


def _product_of(b, shape, dtype, value_of, labels, rng, leaves):
    tensors = [x for x in leaves if not (isinstance(x, tvm.ir.GenericConst) and x.value.numpy().size == 1)]
    if len(tensors) < 2:
        return "b_t is not a product of per-step factors"
    values = {x: rng.uniform(0.5, 1.5, tensor_shape(x)) for x in tensors}
    got = evaluate_from(value_of, b, values)
    if got is None:
        return "b_t could not be evaluated on random factors"
    got = np.broadcast_to(got, shape) if _broadcasts(got.shape, shape) else None
    if got is None:
        return "b_t does not broadcast to the state"
    scalar = 1.0
    for x in leaves:
        if x not in values:
            scalar *= float(x.value.numpy().reshape(()))
    options = [_assignments(tensor_shape(x), labels, shape) for x in tensors]
    if int(np.prod([len(o) for o in options])) > ASSIGNMENTS:
        return "b_t's factors have too many readings along the state's dims"
    for choice in itertools.product(*options):
        want = scalar * _spread([_squeezed(values[x]) for x in tensors], choice, shape)
        if np.allclose(want, got, rtol=1e-6, atol=1e-9):
            return [Factor(x, ls) for x, ls in zip(tensors, choice)] + \
                ([Factor(relax.const(scalar, dtype), ())] if scalar != 1.0 else [])
    return "b_t is not a product of factors along the state's dims"


def looks_outer(value_of, b):
    """A cheap structural test before the numeric ones: ``b`` is a product of at least two
    tensors (not scalars)."""
    return len([x for x in _product_leaves(value_of, b) if tensor_shape(x) not in (None, ())]) >= 2


def _product_leaves(value_of, expr, regroup=True):
    """The factors of a product tree: through ``multiply``, layout views (reshapes that
    regroup dims only with ``regroup``), widening casts, ``einsum`` and ``matmul`` that
    contract nothing (a unit dim at most)."""
    out, stack = [], [expr]
    while stack:
        x = stack.pop()
        value = value_of.get(x) if isinstance(x, relax.Var) else (x if isinstance(x, relax.Call) else None)
        name = op_name(value)
        if not regroup and name == "relax.reshape" and _regroups(value):
            out.append(x)       # (B, G, R, N) -> (B, G*R, N): the merged dims are one state dim
        elif name == "relax.multiply" or (name in _VIEWS) or widening(value):
            stack.extend(a for a in value.args[:2 if name == "relax.multiply" else 1])
        elif name == "relax.einsum" and _contracts_nothing(value):
            stack.extend(value.args[0].fields)
        elif name == "relax.matmul" and _outer_matmul(value):
            stack.extend(value.args)
        else:
            out.append(x)
    return out


def _regroups(call):
    """A ``reshape`` that merges or splits dims that are not 1 (not a unit-dim view)."""
    inner, outer = tensor_shape(call.args[0]), tensor_shape(call)
    return inner is None or outer is None or non_unit(inner) != non_unit(outer)


def _contracts_nothing(call):
    subscripts = str(call.attrs.subscripts)
    if "->" not in subscripts or "..." in subscripts:
        return False
    ins, out = subscripts.split("->")
    return set(ins.replace(",", "")) <= set(out)


def _outer_matmul(call):
    x, y = (tensor_shape(a) for a in call.args)
    return x is not None and y is not None and len(x) >= 2 and len(y) >= 2 and x[-1] == 1 and y[-2] == 1


def _decay(a, state_shape, roles, value_of=None):
    """``a_t`` as a Factor (None when it is 1), or why it is not a decay over the lanes
    and at most one of K, V.  A decay spread over the state by broadcasts (``exp(dt[..., None]
    * A)`` with dt and A expanded to the state's shape first, as HF's Mamba-2 cache path
    writes it) is read below them (``narrowed``), over the dims it varies along."""
    if a is None or a is ONE or _all_ones(a):
        return None
    shape = expr_shape(a)
    if shape is None or not _broadcasts(shape, state_shape):
        return "a_t does not broadcast to the state"
    if value_of is not None:
        a, shape = narrowed(value_of, a)
    offset = len(state_shape) - len(shape)
    labels = tuple(offset + i for i, n in enumerate(shape) if n != 1)
    if roles["K"] in labels and roles["V"] in labels:
        return "the decay a_t varies over both state dims (K and V): not a gate of one of them"
    return Factor(a, labels)


def _all_ones(x):
    return isinstance(x, tvm.ir.GenericConst) and bool(np.all(x.value.numpy() == 1))


# -- numeric helpers -----------------------------------------------------------------------------
def _squeezed(x):
    return np.reshape(x, [n for n in np.shape(x) if n != 1])


def _broadcasts(shape, target):
    if len(shape) > len(target):
        return False
    return all(n in (1, m) for n, m in zip(shape[::-1], target[::-1]))


def _assignments(shape, labels, state_shape):
    """Each way to read the non-unit axes of ``shape``, in order, as distinct state dims of
    equal extent: tuples of state dims."""
    axes = [n for n in shape if n != 1]
    return [p for p in itertools.permutations(labels, len(axes))
            if all(state_shape[d] == n for d, n in zip(p, axes))]


def _spread(arrays, labels, state_shape):
    """The product of ``arrays`` (each along its ``labels``), broadcast to the state's shape."""
    arrays = list(arrays)
    covered = sorted(set().union(*labels))
    prod = _einsum(list(zip(arrays, labels)), covered, state_shape)
    return np.broadcast_to(prod.reshape([state_shape[d] if d in covered else 1
                                         for d in range(len(state_shape))]), state_shape)


def _einsum(operands, out, state_shape):
    """``prod`` of the operands (each ``(array, labels)``) summed over what ``out`` omits."""
    letter = {d: string.ascii_letters[i] for i, d in enumerate(range(len(state_shape)))}
    spec = ",".join("".join(letter[d] for d in ls) for _, ls in operands)
    return np.einsum(f"{spec}->{''.join(letter[d] for d in out)}", *[x for x, _ in operands])
