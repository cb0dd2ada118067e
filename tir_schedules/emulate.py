"""Run a GPU PrimFunc on the CPU, phase by phase, to check what its algorithm computes.

`emulate_gpu` rewrites the kernel mechanically (no hand-written second copy of any algorithm), so
a CPU build of the result computes what the GPU kernel computes, provided the kernel follows the
conventions of README.md: thread-uniform control flow around barriers and shuffles, shuffles
only as the value of a BufferStore, per-thread state that lives across a barrier in `local`
buffers. The model is bulk-synchronous: between two barriers every thread runs to completion
before the next one starts, which is a valid schedule of a race-free kernel. Limits: threadIdx.y
and .z are not emulated; warps are 32 lanes and shuffle widths are assumed to divide 32; the
mask of a shuffle is ignored (all lanes take part).
"""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir import Call, TensorLoad, Var

_SYNC = "tirx.tvm_storage_sync"
_SHUFFLES = ("tirx.tvm_warp_shuffle", "tirx.tvm_warp_shuffle_up",
             "tirx.tvm_warp_shuffle_down", "tirx.tvm_warp_shuffle_xor")
_ACTIVEMASK = "tirx.tvm_warp_activemask"


def _op_name(node) -> str | None:
    return str(node.op.name) if isinstance(node, Call) and hasattr(node.op, "name") else None


def _find(node, pred) -> list:
    """All sub-nodes of `node` (a node or a list of them) for which `pred` holds, in walk order."""
    found = []
    tvm_ffi.structural_walk(node, lambda x: found.append(x) if pred(x) else None)
    return found


def _calls(node, names) -> list:
    return _find(node, lambda x: _op_name(x) in names)


def _seq(stmts: list) -> tirx.Stmt:
    stmts = [s for s in stmts if s is not None]
    if not stmts:
        return tirx.Evaluate(tirx.const(0, "int32"))
    return stmts[0] if len(stmts) == 1 else tirx.SeqStmt(stmts)


def _serial(var: Var, extent, body: tirx.Stmt) -> tirx.For:
    return tirx.For(var, tirx.const(0, var.ty), extent, tirx.ForKind.SERIAL, body)


def _shuffle_source(call: Call, tx):
    """Thread whose operand `call` returns to thread `tx`, with CUDA's __shfl*_sync semantics."""
    _, _, arg, width, _ = call.args
    name, lane = _op_name(call), tirx.floormod(tx, width)
    if name == "tirx.tvm_warp_shuffle_up":
        return tirx.Select(lane >= arg, tx - arg, tx)
    if name == "tirx.tvm_warp_shuffle_down":
        return tirx.Select(lane + arg < width, tx + arg, tx)
    if name == "tirx.tvm_warp_shuffle_xor":  # a later sub-section is out of reach: own value
        src = tirx.bitwise_xor(tx, arg)
        return tirx.Select(tirx.floordiv(src, width) <= tirx.floordiv(tx, width), src, tx)
    return tirx.floordiv(tx, width) * width + tirx.floormod(arg, width)


class _ThreadScope:
    """Emulation of one `threadIdx.x` launch: barrier-free stretches become serial thread loops."""

    def __init__(self, tx: Var, num_threads, reverse: bool = False):
        self.tx, self.nt, self.reverse = tx, num_threads, reverse
        self.allocs: list = []  # hoisted AllocBuffers, emitted once per block
        self.per_thread: dict = {}  # local buffer -> (num_threads, *shape) buffer
        self.thread_vars = {tx}  # values that differ between threads

    def run(self, body: tirx.Stmt) -> tirx.Stmt:
        def hoist(alloc):
            buf = alloc.buffer
            if buf.scope().startswith("local"):
                new = tirx.decl_buffer((self.nt, *buf.shape), buf.dtype, buf.name, scope="global")
                self.per_thread[buf] = new
                self.thread_vars.add(buf)
                alloc = tirx.AllocBuffer(new, dict(alloc.annotations))
            self.allocs.append(alloc)
            return tirx.Evaluate(tirx.const(0, "int32"))

        body = tvm_ffi.structural_map(body, [(tirx.AllocBuffer, hoist)])
        out = self.split(body)
        return _seq(self.allocs + out)

    def uniform(self, *nodes) -> bool:
        return not _find(list(nodes), lambda x: (isinstance(x, Var) and x in self.thread_vars)
                         or _op_name(x) in _SHUFFLES)

    def stretch(self, stmt: tirx.Stmt) -> tirx.Stmt:
        """`for tx in range(num_threads): stmt` (or from the last thread down, `reverse`), with
        per-thread buffers indexed by tx."""
        t = Var("tx", self.tx.ty)
        tid = self.nt - 1 - t if self.reverse else t

        def load(ld):
            new = self.per_thread.get(ld.source)
            return ld if new is None else tirx.BufferLoad(new, [tid, *ld.indices])

        def store(st):
            new = self.per_thread.get(st.buffer)
            return st if new is None else tirx.BufferStore(new, st.value, [tid, *st.indices])

        body = tvm_ffi.structural_map(stmt, [
            (Var, lambda v: tid if v.same_as(self.tx) else v),
            (TensorLoad, load), (tirx.BufferStore, store)])
        return _serial(t, self.nt, body)

    def split(self, stmt: tirx.Stmt) -> list:
        """Emulate `stmt`; a statement without barriers or shuffles is one stretch."""
        if not _calls(stmt, (_SYNC, *_SHUFFLES)):
            return [] if isinstance(stmt, tirx.Evaluate) and isinstance(stmt.value, tirx.IntImm) \
                else [self.stretch(stmt)]
        if isinstance(stmt, tirx.SeqStmt):
            return self.split_seq(list(stmt.seq))
        if isinstance(stmt, tirx.Evaluate) and _op_name(stmt.value) == _SYNC:
            return []  # every thread has finished the previous stretch: the barrier is implicit
        if isinstance(stmt, tirx.BufferStore) and not _calls(list(stmt.indices), _SHUFFLES):
            return self.split_shuffle(stmt)
        guard = {tirx.For: lambda s: (s.min, s.extent), tirx.IfThenElse: lambda s: (s.condition,),
                 tirx.While: lambda s: (s.condition,), tirx.AttrStmt: lambda s: (s.value,)}
        if type(stmt) not in guard:
            raise ValueError(f"cannot emulate a barrier or shuffle inside:\n{stmt}")
        if not self.uniform(*guard[type(stmt)](stmt)):
            raise ValueError("non-uniform barrier or shuffle: it sits under a "
                             f"{type(stmt).__name__} that depends on threadIdx.x:\n{stmt}")
        if isinstance(stmt, tirx.For):
            unrolled = stmt.kind == tirx.ForKind.UNROLLED
            kind = tirx.ForKind.UNROLLED if unrolled else tirx.ForKind.SERIAL
            body = _seq(self.split(stmt.body))
            return [tirx.For(stmt.loop_var, stmt.min, stmt.extent, kind, body,
                             annotations=stmt.annotations, step=stmt.step)]
        if isinstance(stmt, tirx.IfThenElse):
            other = None if stmt.else_case is None else _seq(self.split(stmt.else_case))
            return [tirx.IfThenElse(stmt.condition, _seq(self.split(stmt.then_case)), other)]
        if isinstance(stmt, tirx.While):
            return [tirx.While(stmt.condition, _seq(self.split(stmt.body)))]
        return [tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, _seq(self.split(stmt.body)))]

    def split_seq(self, seq: list) -> list:
        """Cut a sequence at its barriers and shuffles; thread-uniform Binds are kept outside."""
        out, run, run_vars = [], [], []
        for i, s in enumerate(seq):
            hoisted = isinstance(s, tirx.Bind) and self.uniform(s.value)
            if hoisted or _calls(s, (_SYNC, *_SHUFFLES)):
                if run:
                    rest = set(_find(seq[i:], lambda x: isinstance(x, Var)))
                    used = [v for v in run_vars if v in rest]
                    if used:
                        raise ValueError(f"per-thread Bind {used[0]} is used across a barrier or "
                                         "shuffle; keep it in a local buffer instead")
                    out.append(self.stretch(_seq(run)))
                    run, run_vars = [], []
                out += [s] if hoisted else self.split(s)
            else:
                run.append(s)
                if isinstance(s, tirx.Bind):
                    self.thread_vars.add(s.var)
                    run_vars.append(s.var)
        if run:
            out.append(self.stretch(_seq(run)))
        return out

    def split_shuffle(self, store: tirx.BufferStore) -> list:
        """Two phases: every thread stages its operand, then reads its source lane's one."""
        calls = _calls(store.value, _SHUFFLES)
        if not calls or any(_calls(list(c.args), _SHUFFLES) for c in calls):
            raise ValueError(f"cannot emulate nested or misplaced warp shuffles:\n{store}")
        stage, loads = [], []
        for c in calls:
            buf = tirx.decl_buffer((self.nt,), str(c.ty), "shfl_stage", scope="global")
            self.allocs.append(tirx.AllocBuffer(buf))
            stage.append(tirx.BufferStore(buf, c.args[1], [self.tx]))
            loads.append(tirx.BufferLoad(buf, [_shuffle_source(c, self.tx)]))

        def replace(c):
            hit = [ld for k, ld in zip(calls, loads) if k.same_as(c)]
            return hit[0] if hit else c

        read = tvm_ffi.structural_map(store, [(Call, replace)], order="pre")
        return [self.stretch(_seq(stage)), self.stretch(read)]


def emulate_gpu(func: tirx.PrimFunc, reverse_threads: bool = False) -> tirx.PrimFunc:
    """CPU PrimFunc that runs the GPU kernel `func` block by block and phase by phase.

    blockIdx.x/.y launches become serial loops; the threadIdx.x launch is cut at barriers
    (`tvm_storage_sync`) and warp shuffles into serial loops over threads; shared buffers become
    one global-scope buffer per block, local ones one row per thread. Raises ValueError for
    barriers or shuffles under thread-dependent control flow (a kernel bug).

    `reverse_threads` runs each barrier-free stretch from the last thread to the first. A
    race-free kernel computes the same either way; one that reads another thread's write without
    a barrier between them sees the new value in one order and the old in the other, so running
    both orders and comparing catches a missing barrier (`emulate_both_orders`).
    """
    shared = {}

    def to_global(alloc):
        buf = alloc.buffer
        if buf.scope().startswith("local"):
            return alloc
        shared[buf] = tirx.decl_buffer(buf.shape, buf.dtype, buf.name, scope="global")
        return tirx.AllocBuffer(shared[buf], dict(alloc.annotations))

    body = tvm_ffi.structural_map(func.body, [(tirx.AllocBuffer, to_global)])
    body = tvm_ffi.structural_map(body, [(Var, lambda v: shared.get(v, v))])

    def launch(attr):
        if attr.attr_key != "thread_extent":
            return attr
        iv = attr.node
        tag = str(iv.thread_tag)
        if tag in ("blockIdx.x", "blockIdx.y", "blockIdx.z"):
            return _serial(iv.var, attr.value, attr.body)
        if tag == "threadIdx.x":
            return _ThreadScope(iv.var, attr.value, reverse_threads).run(attr.body)
        raise ValueError(f"emulate_gpu cannot emulate a {tag} launch")

    def active_mask(c):  # every lane takes part
        return tirx.const(0xFFFFFFFF if "uint" in str(c.ty) else -1, str(c.ty)) \
            if _op_name(c) == _ACTIVEMASK else c

    body = tvm_ffi.structural_map(body, [(tirx.AttrStmt, launch)])
    body = tvm_ffi.structural_map(body, [(Call, active_mask)])
    if _calls(body, (_SYNC, *_SHUFFLES)):
        raise ValueError("barrier or warp shuffle outside a threadIdx.x launch")
    out = func.with_body(body)
    return out.without_attr("target") if func.attrs and "target" in func.attrs else out


class BothOrders:
    """A GPU kernel emulated twice, threads in forward and in reverse order (see `emulate_gpu`),
    called like a compiled kernel: both run on copies of the same arguments, must agree bit for
    bit (else AssertionError: a race, such as a missing barrier), and the forward run's results
    are written back."""

    def __init__(self, func: tirx.PrimFunc, build):
        self.forward = build(emulate_gpu(func))
        self.backward = build(emulate_gpu(func, reverse_threads=True))

    def __call__(self, *args):
        copies = [tvm.runtime.tensor(a.numpy(), a.device) for a in args]
        self.forward(*args)
        self.backward(*copies)
        for i, (x, y) in enumerate(zip(args, copies)):
            if not np.array_equal(x.numpy(), y.numpy(), equal_nan=True):
                raise AssertionError(f"argument {i} differs between the forward and the reverse thread "
                                     "order: a race between threads (a missing barrier?)")
