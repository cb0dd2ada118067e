"""Attention over a prompt split across ranks: all-gather attention.

A hybrid's attention layers meet the split as one call each, ``PLACEHOLDER(layer, scale,
window, q, k, v)`` (q, k, v of the part as (B, L, heads, D), after the model's rotary
embedding, which read this rank's positions).  Each becomes:

- one all-gather of the part's keys and values, packed in one vector, padded to the longest
  part (``M`` rows; every rank's message has one size);
- attention of the part's queries over every gathered key, masked by position: a key is seen
  when it is a real row (not padding) at a position no later than the query's.  The queries
  are the part's; the keys, the whole prompt's up to this part.

Why all-gather and not a ring: the last rank decodes, so it needs the whole prompt's keys and
values in its cache anyway; with grouped queries K and V are small next to Q; and it keeps one
collective a layer, as the scans have.  The price: every rank computes scores against all
``P * M`` keys (later parts' masked), and holds them; a ring with causal skipping would halve
the work, and a flash kernel the memory.

The gathered keys and values (``(P, B, M, kv heads, D)``) are also returned, so the last rank
can put the whole prompt in the paged KV cache it decodes from.  The parts' lengths come in as
``lengths`` (``(P,)`` int64) and the longest as the shape ``longest`` (``M``); each query's
position as ``position_ids``."""
from dataclasses import dataclass

from tvm import relax

from .scan import allgather

PLACEHOLDER = "scanweaver.paged_attention"   # the attention call the model was traced with
NEVER = 1 << 62                              # the position of a padding row: seen by no query


@dataclass
class Parts:
    """What every split attention of one prefill reads: the ranks, the parts' lengths and the
    longest (``M``, a shape var), and the part's queries' positions ``(B, L)``."""

    world_size: int
    lengths: relax.Expr
    longest: object          # tirx.Var M
    positions: relax.Expr


def placeholder_args(call):
    """``(layer, scale, window, q, k, v)`` of a placeholder attention call, else None."""
    if not (isinstance(call, relax.Call) and len(call.args) == 2 and isinstance(call.args[0], relax.ExternFunc)
            and call.args[0].global_symbol == PLACEHOLDER):
        return None
    layer, scale, window, q, k, v = call.args[1].fields
    return int(layer.value), float(scale.value), int(window.value), q, k, v


def emit_split_attention(bb, parts, scale, q, k, v):
    """Emit the attention of the part's ``q`` over the gathered keys and values; ``(out,
    keys, values)``: out as the placeholder's (B, L, heads, Dv), the gathered keys and values
    ``(P, B, M, kv heads, D)`` (padding rows included)."""
    keys, values = _gather(bb, parts, k, v)
    batch, length, heads, _ = q.ty.shape.values
    kv_heads = int(k.ty.shape.values[2])
    f32 = "float32"

    def as_heads(x):         # (P, B, M, Hkv, d) -> (B, H, P*M, d), float32, kv heads repeated
        d = x.ty.shape.values[4]
        x = relax.op.permute_dims(x, [1, 3, 0, 2, 4])
        x = relax.op.reshape(x, [batch, kv_heads, parts.world_size * parts.longest, d])
        if int(heads) != kv_heads:
            x = relax.op.repeat(x, int(heads) // kv_heads, axis=1)
        return bb.emit(relax.op.astype(x, f32))

    query = bb.emit(relax.op.astype(relax.op.permute_dims(q, [0, 2, 1, 3]), f32))
    scores = bb.emit(relax.op.multiply(relax.op.matmul(query, relax.op.permute_dims(as_heads(keys), [0, 1, 3, 2])),
                                       relax.const(scale, f32)))
    seen = _seen(bb, parts)
    scores = bb.emit(relax.op.where(seen, scores, relax.const(float("-inf"), f32)))
    weights = bb.emit(relax.op.nn.softmax(scores, axis=-1))
    out = bb.emit(relax.op.matmul(weights, as_heads(values)))
    out = bb.emit(relax.op.astype(relax.op.permute_dims(out, [0, 2, 1, 3]), q.ty.dtype))
    return out, keys, values


def _gather(bb, parts, k, v):
    """The one all-gather of a layer: every part's k and v, padded to ``M`` rows."""
    def padded_flat(x):
        b, length, h, d = x.ty.shape.values
        zeros = relax.op.zeros(relax.ShapeExpr([b, parts.longest - length, h, d]), x.ty.dtype)
        full = relax.op.concat([x, zeros], axis=1)
        return relax.op.reshape(full, [b * parts.longest * h * d]), [b, parts.longest, h, d]

    (kf, k_shape), (vf, v_shape) = padded_flat(k), padded_flat(v)
    if v.ty.dtype != k.ty.dtype:
        vf = relax.op.astype(vf, k.ty.dtype)
    packed = bb.emit(relax.op.concat([kf, vf], axis=0))
    k_size = k_shape[0] * k_shape[1] * k_shape[2] * k_shape[3]
    size = packed.ty.shape.values[0]
    rows = bb.emit(relax.op.reshape(allgather(bb, packed, parts.world_size), [parts.world_size, size]))
    keys = relax.op.strided_slice(rows, axes=[1], begin=[0], end=[k_size])
    values = relax.op.strided_slice(rows, axes=[1], begin=[k_size], end=[size])
    return (bb.emit(relax.op.reshape(keys, [parts.world_size] + k_shape)),
            bb.emit(relax.op.reshape(values, [parts.world_size] + v_shape)))


def _seen(bb, parts):
    """(B, 1, L, P*M) bool: key row ``(p, j)`` is seen by a query at position ``t`` when ``j`` is
    within part ``p``'s length and ``p``'s start plus ``j`` is at most ``t``."""
    i64 = "int64"
    lengths = parts.lengths
    starts = relax.op.subtract(relax.op.cumsum(lengths, axis=0), lengths)
    rows = relax.op.arange(0, parts.longest, 1, i64)
    where = relax.op.add(relax.op.expand_dims(starts, 1), relax.op.expand_dims(rows, 0))
    real = relax.op.less(relax.op.expand_dims(rows, 0), relax.op.expand_dims(lengths, 1))
    where = bb.emit(relax.op.reshape(relax.op.where(real, where, relax.const(NEVER, i64)),
                                     [parts.world_size * parts.longest]))
    query = relax.op.expand_dims(relax.op.expand_dims(parts.positions, 1), 3)      # (B, 1, L, 1)
    return bb.emit(relax.op.less_equal(where, query))
