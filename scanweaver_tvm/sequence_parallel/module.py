"""One rank's part of a scan as a Relax module: ``summarize``, the all-gather, ``finish``.

- ``summarize(part)``: the part's summary (transition and state from the empty state,
  ``summaries``) packed in one float32 vector;
- ``main`` passes it to the extern ``scanweaver.ccl.allgather`` (laid out as
  ``R.ccl.allgather``: every rank's vector, concatenated in rank order), once;
- ``finish(part, [h0], gathered, rank)``: folds the summaries of the parts before this rank's
  (after it, for a reverse scan) onto the initial state, runs the part from that state, and
  folds all of them for the final state, which every rank so holds.

The parts' length is symbolic: one module serves every rank.  TVM does all the compute; the
extern only moves bytes (``collective``)."""
from dataclasses import dataclass

import tvm
from tvm import relax, tirx

from scanweaver_core.spec import AffineScanSpec

from . import summaries
from .collective import ALLGATHER
from .parts import PART_LENGTH, view, with_length, with_state

F32 = "float32"


@dataclass(frozen=True)
class Layout:
    """Where each piece lies in a part's packed summary (float32 elements)."""

    transition: list      # shapes of the transition's pieces
    state: list           # shapes of the state's pieces

    @property
    def sizes(self):
        return [_size(s) for s in self.transition + self.state]

    @property
    def elements(self):
        """The summary's length: what each rank contributes to the all-gather."""
        return sum(self.sizes)


def _size(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def layout(spec):
    """The packed summary's ``Layout`` for ``spec`` (any length)."""
    part = with_length(spec, PART_LENGTH)
    return Layout([tuple(s) for s in summaries.transition_shapes(part)],
                  [tuple(s) for _, _, s, _ in summaries.state_parts(part)])


def _check(spec, world_size):
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size: needs a positive int, got {world_size!r}")
    states = summaries.state_parts(spec)
    if any(isinstance(d, str) or d is None for _, _, shape, _ in states for d in shape):
        raise ValueError(f"{type(spec).__name__}: the batch must be static to split the sequence "
                         "(the ranks' summaries have one size)")


def build(spec, world_size):
    """The ``IRModule`` of one rank's part of ``spec`` (the whole scan's spec: its length is
    replaced by the part's) among ``world_size`` ranks."""
    _check(spec, world_size)
    part = with_length(spec, PART_LENGTH)
    lay = layout(spec)
    h0_names = [name for name, *_ in summaries.state_parts(part)]

    def inputs():            # fresh vars for each function (a var has one definition site)
        got = _inputs(part, tirx.Var("L", "int64"))
        return ({n: v for n, v in got.items() if n not in h0_names},
                {n: v for n, v in got.items() if n in h0_names})

    def rank_var():
        return relax.Var("rank", relax.TensorType([], "int64"))

    gathered_type = relax.TensorType([world_size * lay.elements], F32)
    bb = relax.BlockBuilder()
    seq, _ = inputs()
    with bb.function("summarize", list(seq.values()), pure=True):
        moved = summaries.transition(bb, part, seq)
        state = summaries.summary_state(bb, part, seq)
        bb.emit_func_output(bb.emit(_pack(moved + state)))
    seq, given_h0 = inputs()
    gathered, rank = relax.Var("gathered", gathered_type), rank_var()
    with bb.function("finish", list(seq.values()) + list(given_h0.values()) + [gathered, rank], pure=True):
        bb.emit_func_output(_finish(bb, spec, part, seq, given_h0, gathered, rank, world_size, lay))
    mod = bb.get()
    bb = relax.BlockBuilder(mod)
    seq, given_h0 = inputs()
    rank = rank_var()
    with bb.function("main", list(seq.values()) + list(given_h0.values()) + [rank], pure=False):
        packed = bb.emit(relax.Call(mod.get_global_var("summarize"), list(seq.values())))
        gathered = bb.emit(relax.call_dps_packed(ALLGATHER, [packed], gathered_type))
        bb.emit_func_output(bb.emit(relax.Call(mod.get_global_var("finish"), list(seq.values()) +
                                               list(given_h0.values()) + [gathered, rank])))
    return bb.get()


def _inputs(part, length):
    """``{name: relax.Var}`` of the part's inputs, its symbolic length the var ``length``."""
    def dims(shape):
        return [length if d == PART_LENGTH else d for d in shape]
    return {n: relax.Var(n, relax.TensorType(dims(shape), dtype)) for n, (shape, dtype) in view(part).operands.items()}


def _pack(pieces):
    flat = [relax.op.reshape(relax.op.astype(x, F32), [_size(_static(x))]) for x in pieces]
    return flat[0] if len(flat) == 1 else relax.op.concat(flat, axis=0)


def _static(x):
    return [int(d) for d in x.ty.shape.values]


def _unpack(bb, vector, shapes, start=0):
    """The pieces of ``shapes`` from the float32 ``vector``, from element ``start``."""
    out = []
    for shape in shapes:
        n = _size(shape)
        piece = relax.op.strided_slice(vector, axes=[0], begin=[start], end=[start + n])
        out.append(bb.emit(relax.op.reshape(piece, list(shape))))
        start += n
    return out


def _finish(bb, spec, part, seq, given_h0, gathered, rank, world_size, lay):
    states = summaries.state_parts(part)
    if given_h0:
        state = [bb.emit(relax.op.astype(given_h0[name], F32)) for name, *_ in states]
    else:
        state = summaries.default_state(bb, part)
    rows = bb.emit(relax.op.reshape(gathered, [world_size, lay.elements]))
    n_moved = len(lay.transition)
    prefixes = [bb.emit(_pack(state))]
    reverse = getattr(spec, "reverse", False)      # (a selective scan runs forward only)
    order = range(world_size - 1, -1, -1) if reverse else range(world_size)
    for p in order:
        row = bb.emit(relax.op.reshape(relax.op.strided_slice(rows, axes=[0], begin=[p], end=[p + 1]),
                                       [lay.elements]))
        pieces = _unpack(bb, row, lay.transition + lay.state)
        state = summaries.combine(bb, part, state, pieces[:n_moved], pieces[n_moved:])
        prefixes.append(bb.emit(_pack(state)))
    final = state
    stack = bb.emit(relax.op.concat([relax.op.expand_dims(x, 0) for x in prefixes], axis=0))
    index = relax.op.subtract(relax.const(world_size - 1, "int64"), rank) if reverse else rank
    start = _unpack(bb, bb.emit(relax.op.take(stack, index, axis=0, mode="clip")), lay.state)
    outputs = {}
    wanted = view(spec).outputs
    lasts = {last: (x, dtype) for (_, last, _, dtype), x in zip(states, final)}
    if any(n not in lasts for n in wanted):
        run = _finish_spec(part)
        h0 = {name: bb.emit(relax.op.astype(x, dtype)) for (name, _, _, dtype), x in zip(states, start)}
        outputs = summaries.run_scan(bb, run, {**seq, **h0})
    got = [outputs[n] if n not in lasts else bb.emit(relax.op.astype(*lasts[n])) for n in wanted]
    return got[0] if len(got) == 1 else relax.Tuple(got)


def _finish_spec(part):
    """The part's scan from a given state, its per-step output only."""
    if isinstance(part, AffineScanSpec):
        return AffineScanSpec(part.shape, part.a_shape, part.axis, part.reverse, True, part.dtype, ("states",))
    return with_state(part, True, False)


def compile_part(spec, world_size, target="llvm"):
    """``build`` compiled by ``scanweaver_tvm.compile`` for ``target``: a ``relax.VirtualMachine``
    on the host CPU (or the target's device) with ``summarize``, ``finish`` and ``main``."""
    from .. import api   # pylint: disable=import-outside-toplevel

    target = api._target(target)     # pylint: disable=protected-access
    ex = api.compile(build(spec, world_size), target)
    device = tvm.device(target.kind.name if target.kind.name != "llvm" else "cpu")
    return relax.VirtualMachine(ex, device)
