"""A scan's sequence cut into consecutive parts, one a rank: where each part lies, each operand's
time axis, and the specs a part runs (its scan from the empty state, and from a given one).

Every spec is read through one view (``ScanView``): its inputs in order with shapes and
dtypes, the initial-state inputs and last-state outputs that pair up, and the outputs the user
asked for.  Parts are built with a symbolic length ``"L"``, so one compiled module serves
every rank's part whatever its length."""
import dataclasses
from dataclasses import dataclass

from .spec import (AffineScanSpec, DeltaScanSpec, MatrixScanSpec, MLSTMScanSpec, SelectiveScanSpec,
                                  StabilizedScanSpec)

PART_LENGTH = "L"          # the symbolic length of a part


def split(length, parts):
    """``[(start, stop), ...]``: ``length`` steps cut into ``parts`` consecutive pieces as even
    as can be (the first ``length % parts`` one step longer), each at least one step."""
    if not isinstance(parts, int) or parts < 1:
        raise ValueError(f"parts: needs a positive int, got {parts!r}")
    if length < parts:
        raise ValueError(f"a sequence of {length} steps cannot be cut into {parts} parts of at least one step")
    base, extra = divmod(length, parts)
    bounds, start = [], 0
    for p in range(parts):
        stop = start + base + (p < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


@dataclass(frozen=True)
class ScanView:
    """One spec as the split reads it (``view``)."""

    operands: dict        # input name -> (shape, dtype), in the kernel's order (h0 parts included)
    states: list          # [(h0 input name, last-state output name, shape, dtype)], in order
    outputs: list         # the outputs the spec returns, in order


def view(spec):
    """The ``ScanView`` of any scan spec."""
    if isinstance(spec, AffineScanSpec):
        ops = {"a": (spec.a_shape, spec.dtype), "b": (spec.shape, spec.dtype)}
        if spec.has_h0:
            ops["h0"] = (spec.state_shape, spec.dtype)
        return ScanView(ops, [("h0", "last", spec.state_shape, spec.dtype)], list(spec.outputs))
    if isinstance(spec, SelectiveScanSpec):
        shapes = spec.buffer_shapes()
        names = list(shapes)[:list(shapes).index("out")]
        dtypes = {n: "float32" if n in ("A", "D", "delta_bias") else spec.dtype for n in names}
        state = shapes.get("h0", (spec.batch, spec.dim, spec.dstate))
        return ScanView({n: (shapes[n], dtypes[n]) for n in names}, [("h0", "last_state", state, spec.dtype)],
                        ["out"] + (["last_state"] if spec.return_last_state else []))
    if isinstance(spec, MatrixScanSpec):
        ops = {n: (s, spec.operand_dtypes()[n]) for n, s in spec.operand_shapes().items()}
        return ScanView(ops, [("h0", "last", spec.state_shape, spec.dtype)],
                        ["o"] + (["last"] if spec.return_last_state else []))
    if isinstance(spec, (StabilizedScanSpec, MLSTMScanSpec, DeltaScanSpec)):
        shapes, dtypes = spec.buffer_shapes(), spec.buffer_dtypes()
        full = dataclasses.replace(spec, has_h0=True, return_last_state=True)
        h0s = [n for n in full.operand_names() if n.endswith("0")]      # (S0; C0, n0, m0; ...)
        full_shapes = full.buffer_shapes()
        return ScanView({n: (shapes[n], dtypes[n]) for n in spec.operand_names()},
                        [(i, o, full_shapes[i], "float32") for i, o in zip(h0s, full.output_names()[1:])],
                        spec.output_names())
    raise TypeError(f"not a scan spec: {type(spec).__name__}")


def with_length(spec, length):
    """``spec`` over ``length`` steps (an int, or a name): every per-step extent changed, a
    broadcast one (1 on the time axis) kept."""
    if isinstance(spec, AffineScanSpec):
        shape = list(spec.shape)
        a_shape = list(spec.a_shape)
        if a_shape[spec.axis] != 1 or spec.shape[spec.axis] == 1:
            a_shape[spec.axis] = length
        shape[spec.axis] = length
        return AffineScanSpec(tuple(shape), tuple(a_shape), spec.axis, spec.reverse, spec.has_h0, spec.dtype,
                              spec.outputs)
    if isinstance(spec, MatrixScanSpec):
        def per_step(shape):
            return shape if not shape or shape[2] == 1 else shape[:2] + (length,) + shape[3:]
        return dataclasses.replace(spec, length=length, q_shape=per_step(spec.q_shape),
                                   k_shape=per_step(spec.k_shape), v_shape=per_step(spec.v_shape),
                                   g_shape=per_step(spec.g_shape))
    return dataclasses.replace(spec, length=length)


def time_axes(spec):
    """``{input name: axis}`` of the inputs that have one step per entry along an axis (the
    rest, parameters and initial states, every rank holds whole)."""
    one, two = view(with_length(spec, 2)).operands, view(with_length(spec, 3)).operands
    axes = {}
    for name, (shape, _) in one.items():
        differ = [i for i, (x, y) in enumerate(zip(shape, two[name][0])) if x != y]
        if differ:
            axes[name] = differ[0]
    return axes


def with_state(spec, has_h0, return_last_state):
    """``spec`` taking an initial state and returning its last one, as asked."""
    if isinstance(spec, AffineScanSpec):
        outputs = ("states", "last") if return_last_state else ("states",)
        return AffineScanSpec(spec.shape, spec.a_shape, spec.axis, spec.reverse, has_h0, spec.dtype, outputs)
    return dataclasses.replace(spec, has_h0=has_h0, return_last_state=return_last_state)


def split_operands(spec, operands, parts):
    """``operands`` (``{name: array}`` of the whole sequence) as ``parts`` dicts, one a rank:
    per-step inputs sliced along their time axis, the rest shared."""
    axes = time_axes(spec)
    length = spec.length if not isinstance(spec, AffineScanSpec) else spec.shape[spec.axis]
    out = []
    for start, stop in split(length, parts):
        out.append({n: x[(slice(None),) * axes[n] + (slice(start, stop),)] if n in axes else x
                    for n, x in operands.items()})
    return out


def output_time_axis(spec, name):
    """The time axis of output ``name`` (per step), or None for a last state."""
    if isinstance(spec, StabilizedScanSpec):
        return spec.time_axis if name == "out" else None
    source = {"states": "b", "out": "u", "o": "v", "h": "v"}.get(name)
    return None if source is None else time_axes(spec)[source]
