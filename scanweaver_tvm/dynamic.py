"""``from_torch(..., dynamic_shapes=...)``: trace short, fuse, generalize to symbolic dims.

The spec is ``torch.export``'s own ``dynamic_shapes``: per input (by position, or by the name
of ``forward``'s parameter) a dict ``{dim: Dim}`` or a sequence with a ``Dim`` (or None) per
dim; a ``Dim`` may be ``torch.export.Dim("L")`` or just its name.  The model is traced at small
sizes of every dynamic dim (inputs are resized by repeating their own values along it, so token
ids stay valid), each trace is fused, and ``generalize`` makes one module of them.
"""
import inspect

from tvm import relax, tirx

from .generalize import GeneralizeError, generalize
from .generalize_fit import grid

__all__ = ["dims_of", "static_dims", "trace_sizes", "import_generic", "traced"]

_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83)


def _dim_name(dim, where):
    if isinstance(dim, str):
        return dim, 1, None
    name = getattr(dim, "__name__", None)
    if name is None or hasattr(dim, "root"):
        raise ValueError(f"dynamic_shapes: {where}: {dim!r} is not a named torch.export.Dim (derived "
                         "dims and Dim.AUTO are not supported: name each dynamic dim)")
    lo, hi = getattr(dim, "min", None), getattr(dim, "max", None)
    return name, lo, hi


def dims_of(model, example_args, dynamic_shapes):
    """``{(arg index, axis): (name, min, max)}`` from a ``dynamic_shapes`` spec."""
    try:
        params = [p for p in inspect.signature(model.forward).parameters]
    except (TypeError, ValueError):
        params = []
    if isinstance(dynamic_shapes, dict):
        items = []
        for key, spec in dynamic_shapes.items():
            index = key if isinstance(key, int) else params.index(key) if key in params else None
            if index is None or not 0 <= index < len(example_args):
                raise ValueError(f"dynamic_shapes: {key!r} is not one of the inputs "
                                 f"({', '.join(params[:len(example_args)]) or len(example_args)})")
            items.append((index, spec))
    else:
        items = list(enumerate(dynamic_shapes))
        if len(items) != len(example_args):
            raise ValueError(f"dynamic_shapes: {len(items)} entries for {len(example_args)} inputs")
    out = {}
    for index, spec in items:
        if spec is None:
            continue
        rank = example_args[index].dim()
        axes = spec.items() if isinstance(spec, dict) else enumerate(spec)
        for axis, dim in axes:
            if dim is None:
                continue
            if not -rank <= axis < rank:
                raise ValueError(f"dynamic_shapes: input {index} has rank {rank}, no dim {axis}")
            out[(index, axis % rank)] = _dim_name(dim, f"input {index} dim {axis}")
    if not out:
        raise ValueError("dynamic_shapes: names no dynamic dim")
    return out


def static_dims(shapes, dims):
    """The sizes of the inputs' dims that stay static."""
    return {int(n) for i, shape in enumerate(shapes) for a, n in enumerate(shape) if (i, a) not in dims}


def trace_sizes(static, dims, requested=None):
    """Three sizes per dim name (two for the fit, one to confirm): small primes within the Dim's
    bounds that equal no ``static`` dim of the inputs nor another dim's sizes, from 2 for a
    leading (batch-like) dim and from 3 for the others; ``requested`` (name -> sizes) overrides."""
    names, taken, sizes = {}, set(static), {}
    for (index, axis), (name, lo, hi) in dims.items():
        names.setdefault(name, (lo, hi, axis))
    for name, (lo, hi, axis) in names.items():
        if requested and name in requested:
            sizes[name] = tuple(int(v) for v in requested[name])
            if len(sizes[name]) < 2 or len(set(sizes[name])) != len(sizes[name]):
                raise ValueError(f"trace_sizes: {name} needs at least two distinct sizes")
        else:
            start = max(2 if axis == 0 else 3, lo or 1)
            pool = [p for p in _PRIMES if p >= start and (hi is None or p <= hi) and p not in taken]
            if len(pool) < 3:
                raise ValueError(f"dynamic_shapes: Dim {name} (min {lo}, max {hi}) leaves no three "
                                 "trace sizes; pass trace_sizes")
            sizes[name] = tuple(pool[:3])
        taken.update(sizes[name])
    return sizes


def _resized(x, axis, n):
    """``x`` with ``n`` entries along ``axis``, repeating its own values."""
    import torch

    index = torch.arange(n) % x.shape[axis]
    return x.index_select(axis, index)


def _inputs_at(example_args, dims, point):
    args = list(example_args)
    for (index, axis), (name, _, _) in dims.items():
        args[index] = _resized(args[index], axis, point[name])
    return args


def import_generic(import_fixed, fuse, model, example_args, dynamic_shapes, requested_sizes=None):
    """Trace with ``import_fixed(args)`` at the sizes of ``trace_sizes``, fuse each with
    ``fuse(mod)``, generalize.  Returns the module; its ``main`` takes inputs whose dynamic dims
    are the symbolic Vars named after the Dims."""
    dims = dims_of(model, example_args, dynamic_shapes)
    sizes = trace_sizes(static_dims([x.shape for x in example_args], dims), dims, requested_sizes)
    lower = {name: lo for name, lo, _ in dims.values() if lo}
    return traced(lambda point: import_fixed(_inputs_at(example_args, dims, point)), fuse, sizes, lower)


def traced(import_at, fuse, sizes, lower=None):
    """``import_at(point)`` (a module traced at ``point``: dim name -> size) at every point of
    ``grid(sizes)``, each fused and generalized into one module (``lower``: the Dims' ``min``)."""
    points = grid(sizes)
    mods, first = [], None
    for point in points:
        mod = import_at(point)
        first = first or mod
        mods.append(relax.transform.DeadCodeElimination()(fuse(mod)))
    symbols = {name: tirx.Var(name, "int64") for name in sizes}
    try:
        return generalize(mods, points, symbols, lower)
    except GeneralizeError as err:
        raise GeneralizeError(f"{err}{_near_misses(first)}") from None
    except Exception as err:      # a TVM failure inside rebuilding: say where we were
        raise GeneralizeError(f"generalizing the traces at {points} failed: {err}") from err


def _near_misses(mod):
    """The recurrences the pass left alone in a trace, with why: what usually keeps the
    traces apart (each leaves its own number of unrolled steps)."""
    from relax_pass.fuse import analyze

    misses = [f"{r.form} ({r.reason})" for r in analyze(mod) if r.rejected]
    return f"; near misses left unrolled in the traces: {'; '.join(misses)}" if misses else ""

