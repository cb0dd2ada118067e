"""A scan split across ranks, in Relax: each rank ``summarize``s its part, one all-gather shares
the summaries, each ``finish``es its part.

- ``summarize``: the part's summary (transition and state from the empty state,
  ``summaries``) packed in one float32 vector;
- the extern ``scanweaver.ccl.allgather`` (``ALLGATHER``, laid out as ``R.ccl.allgather``:
  every rank's vector, concatenated in rank order) called once;
- ``finish``: the summaries of the parts before this rank's (after it, for a reverse scan)
  folded onto the initial state, the part run from that state, and all of them folded for the
  final state, which every rank so holds.

``emit_split_scan`` emits the three in place of one scan call (``SplitSequence`` does so in a
model); ``build`` makes them a module of one rank's part, its length symbolic, so that one
module serves every rank.  TVM does all the compute; the extern only moves bytes."""
import math
from dataclasses import dataclass

from tvm import relax, tirx

from scanweaver_core.sequence_parts import PART_LENGTH, view, with_length, with_state
from . import summaries

ALLGATHER = "scanweaver.ccl.allgather"
F32 = "float32"


@dataclass(frozen=True)
class Layout:
    """Where each piece lies in a part's packed summary (float32 elements)."""

    transition: list      # shapes of the transition's pieces
    state: list           # shapes of the state's pieces

    @property
    def elements(self):
        """The summary's length: what each rank contributes to the all-gather."""
        return sum(math.prod(s) for s in self.transition + self.state)


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


def summarize(bb, part, seq):
    """Emit the part's packed summary from its per-step inputs ``seq`` (``{name: expr}``)."""
    moved = summaries.transition(bb, part, seq)
    state = summaries.summary_state(bb, part, seq)
    return bb.emit(_pack(moved + state))


def allgather(bb, packed, world_size):
    """Emit one all-gather: every rank's ``packed`` vector (any dtype; its length may be
    symbolic, equal on every rank), in rank order."""
    size = packed.ty.shape.values[0]
    return bb.emit(relax.call_dps_packed(ALLGATHER, [packed], relax.TensorType([world_size * size], packed.ty.dtype)))


def emit_split_scan(bb, spec, given, rank, world_size):
    """Emit ``spec``'s scan over this rank's part (``given``: ``{input name: expr}``, the
    part's per-step inputs and any initial state, held whole by every rank) as summarize,
    all-gather, finish; ``{output name: expr}`` of the outputs ``spec`` returns."""
    _check(spec, world_size)
    h0_names = {name for name, *_ in summaries.state_parts(spec)}
    seq = {n: x for n, x in given.items() if n not in h0_names}
    gathered = allgather(bb, summarize(bb, spec, seq), world_size)
    return finish(bb, spec, seq, {n: x for n, x in given.items() if n in h0_names}, gathered, rank, world_size)


def build(spec, world_size):
    """The ``IRModule`` of one rank's part of ``spec`` (the whole scan's spec: its length is
    replaced by the part's) among ``world_size`` ranks: ``summarize(part)``, ``finish(part,
    [h0], gathered, rank)`` and ``main(part, [h0], rank)``, which calls the all-gather."""
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

    def output(bb, got):
        got = [got[n] for n in view(spec).outputs]
        bb.emit_func_output(got[0] if len(got) == 1 else relax.Tuple(got))

    bb = relax.BlockBuilder()
    seq, _ = inputs()
    with bb.function("summarize", list(seq.values()), pure=True):
        bb.emit_func_output(summarize(bb, part, seq))
    seq, given_h0 = inputs()
    gathered = relax.Var("gathered", relax.TensorType([world_size * lay.elements], F32))
    rank = rank_var()
    with bb.function("finish", list(seq.values()) + list(given_h0.values()) + [gathered, rank], pure=True):
        output(bb, finish(bb, part, seq, given_h0, gathered, rank, world_size))
    seq, given_h0 = inputs()
    rank = rank_var()
    with bb.function("main", list(seq.values()) + list(given_h0.values()) + [rank], pure=False):
        output(bb, emit_split_scan(bb, part, {**seq, **given_h0}, rank, world_size))
    return bb.get()


def _inputs(part, length):
    """``{name: relax.Var}`` of the part's inputs, its symbolic length the var ``length``."""
    def dims(shape):
        return [length if d == PART_LENGTH else d for d in shape]
    return {n: relax.Var(n, relax.TensorType(dims(shape), dtype)) for n, (shape, dtype) in view(part).operands.items()}


def _pack(pieces):
    flat = [relax.op.reshape(relax.op.astype(x, F32), [math.prod(_static(x))]) for x in pieces]
    return flat[0] if len(flat) == 1 else relax.op.concat(flat, axis=0)


def _static(x):
    return [int(d) for d in x.ty.shape.values]


def _unpack(bb, vector, shapes, start=0):
    """The pieces of ``shapes`` from the float32 ``vector``, from element ``start``."""
    out = []
    for shape in shapes:
        n = math.prod(shape)
        piece = relax.op.strided_slice(vector, axes=[0], begin=[start], end=[start + n])
        out.append(bb.emit(relax.op.reshape(piece, list(shape))))
        start += n
    return out


def finish(bb, part, seq, given_h0, gathered, rank, world_size):
    """Emit the end of ``part``'s split scan: the state this rank starts from, folded from the
    ``gathered`` summaries and the initial state (``given_h0``, else the default), the part run
    from it, the final state; ``{output name: expr}``."""
    lay = layout(part)
    states = summaries.state_parts(part)
    if given_h0:
        state = [bb.emit(relax.op.astype(given_h0[name], F32)) for name, *_ in states]
    else:
        state = summaries.default_state(bb, part)
    rows = bb.emit(relax.op.reshape(gathered, [world_size, lay.elements]))
    n_moved = len(lay.transition)
    prefixes = [bb.emit(_pack(state))]
    reverse = getattr(part, "reverse", False)      # (a selective scan runs forward only)
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
    wanted = view(part).outputs
    lasts = {last: (x, dtype) for (_, last, _, dtype), x in zip(states, final)}
    if any(n not in lasts for n in wanted):
        run = with_state(part, True, False)      # (from the given state, per-step outputs only)
        h0 = {name: bb.emit(relax.op.astype(x, dtype)) for (name, _, _, dtype), x in zip(states, start)}
        outputs = summaries.run_scan(bb, run, {**seq, **h0})
    return {n: outputs[n] if n not in lasts else bb.emit(relax.op.astype(*lasts[n])) for n in wanted}

