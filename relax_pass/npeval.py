"""Evaluate small Relax subgraphs with numpy, to check what they compute.

The selective-scan matcher must know that ``exp``'s argument is ``delta[b, d, l] * A[d, n]``
and the step input ``delta*B*u`` with the right index placement, or that a per-step readout is
``einsum('bdn,bn->bd', h, C_t)``, however the frontend wrote them: broadcast ``multiply``s of
``expand_dims``/``permute_dims``/``reshape`` views and ``matmul``s (PyTorch), or one ``einsum``
each (ONNX).  Running those few view/linear ops on random probe inputs checks the multilinear
map they compute against the intended einsum, for any spelling.
"""
from tvm import relax

from .interpret import EVAL_ERRORS, Interpreter
from .steps import op_name, tensor_shape

VIEW_OPS = ("relax.expand_dims", "relax.permute_dims", "relax.reshape", "relax.broadcast_to",
            "relax.squeeze")


SUPPORTED = VIEW_OPS + ("relax.matmul", "relax.multiply", "relax.add", "relax.sum", "relax.einsum",
                        "relax.sigmoid", "relax.nn.silu", "relax.exp", "relax.log", "relax.greater",
                        "relax.where", "relax.nn.softplus")


def inputs(call):
    """The tensors a supported op reads: not the target shape of ``reshape``/``broadcast_to``,
    and the fields of ``einsum``'s operand tuple."""
    name = op_name(call)
    if name in ("relax.reshape", "relax.broadcast_to"):
        return list(call.args[:1])
    if name == "relax.einsum" and isinstance(call.args[0], relax.Tuple):
        return list(call.args[0].fields)
    return list(call.args)


def evaluate(value_of, expr, env):
    """numpy value of ``expr`` given ``env`` (var -> array), through ``SUPPORTED`` ops only
    (``interpret.py`` gives them their meaning); None if it needs anything else."""
    interp = Interpreter(value_of, ops=SUPPORTED)
    interp.memo.update(env)
    try:
        return interp(expr)
    except EVAL_ERRORS:
        return None


def view_chain(value_of, expr):
    """``expr`` and every tensor below it through view ops, top first."""
    chain = [expr]
    while isinstance(expr, relax.Var) and op_name(value_of.get(expr)) in VIEW_OPS:
        expr = value_of[expr].args[0]
        chain.append(expr)
    return chain


def viewed_tensor(value_of, expr, shapes):
    """The first tensor below ``expr`` (through views) whose shape is in ``shapes``, or None."""
    return next((x for x in view_chain(value_of, expr) if tensor_shape(x) in shapes), None)


def multiply_factors(value_of, expr):
    """The leaves of a tree of ``multiply`` bindings."""
    call = value_of.get(expr) if isinstance(expr, relax.Var) else None
    if op_name(call) == "relax.multiply":
        return multiply_factors(value_of, call.args[0]) + multiply_factors(value_of, call.args[1])
    return [expr]
