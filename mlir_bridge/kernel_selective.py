"""Mamba's selective scan as a ``gpu.func`` in upstream dialects, from the Blelloch stage.

One block per (batch, channel) (``gpu.block_id x = b*D + d``), ``threads`` threads, L walked in
tiles of ``tile = 2*threads`` steps; thread ``tid`` owns the tile's steps ``tid`` and
``tid + threads`` (coalesced global loads).  Per tile:

1. stage ``dt = softplus(delta + bias)`` (as configured) and ``dt*u`` in workgroup memory, y = 0;
2. for each state n: the pairs ``(exp(dt*A[d,n]), dt*u*B[b,g,n,t])`` (identity past L), a
   Blelloch scan of them (``kernel_common.blelloch_tile``), each step's state from its inclusive
   prefix applied to the carry of n, and ``y += C[b,g,n,t]*h``;
3. the epilogue ``out = (y + D*u) * silu(z)``.

The carries (h0 or 0 at the start) live in workgroup memory after the Blelloch root's tile
total (``state = [total_a, total_u, carries of even tiles, carries of odd tiles]``),
double-buffered by tile parity:
thread 0 writes the next tile's carry (the tile total applied to it) while the others still
read this tile's, which saves a barrier per state.  Nothing a thread computes crosses a barrier
(kernel_common's contract), so the CPU route is derived from this IR mechanically.  Inputs in
fp16/bf16 are widened on load; everything accumulates in f32; out/last_state are narrowed.
"""
from . import emit
from .emit import MLIR_DTYPES
from .kernel_common import (Kernel, barrier, bind_params, blelloch_tile, compose, identity,
                            param_type, workgroup_buffer)
from .operands import digest, operands


def log1p(b, v):
    """``log(1 + v)`` to a few ulp as ``log(w) * v / (w - 1)``, ``w = 1 + v`` (``v`` where w
    rounds to 1).  Spelled out because the CPU route's ``--convert-math-to-llvm`` turns
    ``math.log1p`` into a plain ``log(1 + v)``, which loses every digit of a tiny ``v``."""
    w = b.add(b.f32(1.0), v)
    ratio = b.binary("divf", v, b.sub(w, b.f32(1.0)))
    return b.select(b.op("arith.cmpf", [w, b.f32(1.0)], ["i1"], {"predicate": emit.attr_int(1)}),
                    v, b.mul(b.math("log", w), ratio))


def softplus(b, x):
    """``max(x, 0) + log1p(exp(-|x|))``: accurate on both sides of PyTorch's threshold (20)."""
    neg_abs = b.op("arith.negf", [b.math("absf", x)], ["f32"])
    return b.add(b.binary("maximumf", x, b.f32(0.0)), log1p(b, b.math("exp", neg_abs)))


def silu(b, z):
    return b.binary("divf", z, b.add(b.f32(1.0), b.math("exp", b.op("arith.negf", [z], ["f32"]))))


class _Block:
    """Thread-uniform values of one (batch, channel) block and per-step accessors."""

    def __init__(self, b, spec, v, blk, tid, threads):
        self.b, self.spec, self.v, self.tid, self.threads = b, spec, v, tid, threads
        dim, length = spec.dim, spec.length
        self.batch = b.binary("divui", blk, b.index(dim))
        self.chan = b.binary("remui", blk, b.index(dim))
        self.row = b.mul(blk, b.index(length))                    # u/delta/z/out of (b, d)
        self.length, self.last_t = b.index(length), b.index(length - 1)
        if spec.groups:
            group = b.binary("divui", self.chan, b.index(dim // spec.groups))
            self.bc_lane = b.add(b.mul(self.batch, b.index(spec.groups)), group)
        else:
            self.bc_lane = self.batch

    def owned(self, k):
        """The tile slot ``j`` of this thread's k-th step."""
        return self.b.add(self.tid, self.b.index(k * self.threads)) if k else self.tid

    def step(self, start, j):
        """(valid, clamped t) of tile slot j."""
        b = self.b
        pos = b.add(start, j)
        valid = b.cmpi("ult", pos, self.length)
        return valid, b.select(valid, pos, self.last_t)

    def load(self, name, t):
        """An operand of shape (B, D, L) at (b, d, t), in f32."""
        return self.b.to_f32(self.b.load(self.v[name], [self.b.add(self.row, t)]))

    def bc(self, name, n, t):
        """B or C at (b, [g,] n, t), in f32."""
        b, spec = self.b, self.spec
        base = b.mul(b.add(b.mul(self.bc_lane, b.index(spec.dstate)), n), b.index(spec.length))
        return b.to_f32(b.load(self.v[name], [b.add(base, t)]))

    def param(self, name, idx):
        return self.b.load(self.v[name], [idx])


def generate(stage):
    """Kernel for a ``stage_blelloch.BlellochStage`` of a selective spec."""
    spec, tile, threads = stage.spec, stage.tile, stage.threads
    ops = operands(spec)
    elem, n_state = MLIR_DTYPES[spec.dtype], spec.dstate
    arg_types = [param_type(shape, dt) for _, shape, dt, _ in ops]
    ntiles = -(-spec.length // tile)
    b, globals_ = emit.Builder(), []
    name = "scanweaver_selective_scan_" + digest(spec)

    def body(args):
        buf = {key: workgroup_buffer(b, globals_, f"sw_{key}", size) for key, size in (
            ("pairs_a", tile), ("pairs_u", tile), ("elem_a", tile), ("elem_u", tile),
            ("dt", tile), ("du", tile), ("y", tile), ("state", 2 + 2 * n_state))}
        tid = b.op("gpu.thread_id", [], ["index"], props={"dimension": "#gpu<dim x>"}, hint="tid")
        blk = b.op("gpu.block_id", [], ["index"], props={"dimension": "#gpu<dim x>"}, hint="blk")
        v = bind_params(b, ops, args, None)
        at = _Block(b, spec, v, blk, tid, threads)
        zero, n_ext, t_ext = b.index(0), b.index(n_state), b.index(threads)
        state_row = b.mul(blk, n_ext)                               # h0/last_state of (b, d)

        with b.for_(tid, n_ext, t_ext) as n:                        # carry <- h0 or 0
            h0 = b.to_f32(b.load(v["h0"], [b.add(state_row, n)])) if spec.has_h0 else b.f32(0.0)
            b.store(h0, buf["state"], [b.add(n, b.index(2))])
        with b.for_(zero, b.index(ntiles)) as tile_idx:
            start = b.mul(tile_idx, b.index(tile))
            read = b.add(b.mul(b.binary("remui", tile_idx, b.index(2)), n_ext), b.index(2))
            write = b.sub(b.index(n_state + 4), read)                 # the other parity
            for k in range(2):                                      # 1. dt, dt*u; y = 0
                j = at.owned(k)
                _, t = at.step(start, j)
                dt = at.load("delta", t)
                if spec.has_delta_bias:
                    dt = b.add(dt, at.param("delta_bias", at.chan))
                if spec.delta_softplus:
                    dt = softplus(b, dt)
                b.store(dt, buf["dt"], [j])
                b.store(b.mul(dt, at.load("u", t)), buf["du"], [j])
                b.store(b.f32(0.0), buf["y"], [j])
            barrier(b)
            with b.for_(zero, n_ext) as n:                          # 2. per state
                a_dn = at.param("A", b.add(b.mul(at.chan, n_ext), n))
                for k in range(2):
                    j = at.owned(k)
                    valid, t = at.step(start, j)
                    one, nil = identity(b)
                    pair = (b.select(valid, b.math("exp", b.mul(b.load(buf["dt"], [j]), a_dn)), one),
                            b.select(valid, b.mul(b.load(buf["du"], [j]), at.bc("B", n, t)), nil))
                    for key, value in zip(("pairs_a", "pairs_u", "elem_a", "elem_u"), pair * 2):
                        b.store(value, buf[key], [j])
                barrier(b)
                blelloch_tile(b, tid, tile, buf["pairs_a"], buf["pairs_u"], buf["state"])
                carry = b.load(buf["state"], [b.add(read, n)])
                for k in range(2):
                    j = at.owned(k)
                    _, t = at.step(start, j)
                    inc = compose(b, (b.load(buf["pairs_a"], [j]), b.load(buf["pairs_u"], [j])),
                                  (b.load(buf["elem_a"], [j]), b.load(buf["elem_u"], [j])))
                    h = b.add(b.mul(inc[0], carry), inc[1])
                    b.store(b.add(b.load(buf["y"], [j]), b.mul(at.bc("C", n, t), h)), buf["y"], [j])
                with b.if_(b.cmpi("eq", tid, zero)):                # next tile's carry of n
                    total = (b.load(buf["state"], [zero]), b.load(buf["state"], [b.index(1)]))
                    b.store(b.add(b.mul(total[0], carry), total[1]), buf["state"], [b.add(write, n)])
                barrier(b)
            for k in range(2):                                      # 3. epilogue
                j = at.owned(k)
                valid, t = at.step(start, j)
                with b.if_(valid):
                    y = b.load(buf["y"], [j])
                    if spec.has_D:
                        y = b.add(y, b.mul(at.param("D", at.chan), at.load("u", t)))
                    if spec.has_z:
                        y = b.mul(y, silu(b, at.load("z", t)))
                    b.store(b.from_f32(y, elem), v["out"], [b.add(at.row, t)])
        if spec.return_last_state:
            final = b.index(2 + (ntiles % 2) * n_state)
            with b.for_(tid, n_ext, t_ext) as n:
                h = b.load(buf["state"], [b.add(final, n)])
                b.store(b.from_f32(h, elem), v["last_state"], [b.add(state_row, n)])
        b.op("gpu.return")

    func = emit.func(b, name, arg_types, [], body, op_name="gpu.func",
                     attrs={"gpu.kernel": "unit", "known_block_size": emit.attr_dense([threads, 1, 1], "i32")})
    blocks = spec.batch * spec.dim
    return Kernel(name, func, globals_, [("ptr", n) for n, *_ in ops], threads,
                  lambda env=None: (blocks, 1, 1), 7 * (-(-4 * tile // 16) * 16) + 4 * (2 + 2 * n_state))
