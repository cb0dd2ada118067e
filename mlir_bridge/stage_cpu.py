"""Stage 6: the CPU route, derived mechanically from the gpu.func op tree.

Blocks become an outer ``scf.for`` over the block id; each stretch of ops between
``gpu.barrier``s becomes an ``scf.for`` over the thread id; workgroup buffers become
``memref.alloca``s; thread-uniform pure ops (constants, index math on block id, L, views) are
hoisted out of the thread loops.  A thread value used across a barrier breaks the kernel
contract and raises ``ValueError``.  The entry returns i32 0 (C ABI for TVM's call_extern).
"""
from dataclasses import dataclass

from . import emit
from .tools import mlir_opt

PURE_PREFIXES = ("arith.", "math.", "memref.reinterpret_cast")


@dataclass(frozen=True)
class CpuStage:
    spec: object
    entry: str
    text: str


def _has_barrier(op):
    return any(o.name == "gpu.barrier" for o in op.walk())


class _Lowering:
    def __init__(self, kernel):
        self.b = emit.Builder()
        self.kernel = kernel
        self.vmap = {}
        self.varying = set()       # values (new) that differ per thread
        self.stretch = []          # original ops waiting for the current thread loop
        self.tid = None
        self.in_thread_loop = False

    def value(self, v):
        new = self.vmap[id(v)]
        if isinstance(new, _Poison) and self.in_thread_loop and new.op.name.startswith(PURE_PREFIXES):
            return self.clone(new.op)[0]      # a pure thread value: recompute it in this stretch
        return new

    def copy_regions(self, op, fill):
        """New regions shaped like ``op``'s: each block's arguments remapped, then ``fill(block)``
        emits its body at the new block."""
        regions = []
        for region in op.regions:
            new_region = []
            for blk in region:
                with self.b.block([a.type for a in blk.args]) as nb:
                    for old, new in zip(blk.args, nb.args):
                        self.vmap[id(old)] = new
                    fill(blk)
                new_region.append(nb)
            regions.append(new_region)
        return regions

    def clone(self, op):
        """Copy ``op`` (and its regions) at the insertion point with operands remapped."""
        def fill(blk):
            for inner in blk.ops:
                self.clone(inner)

        regions = self.copy_regions(op, fill)
        results = [self.b.fresh(r.type) for r in op.results]
        self.b.append(emit.Op(op.name, [self.value(v) for v in op.operands], results,
                              op.props, op.attrs, regions))
        for old, new in zip(op.results, results):
            self.vmap[id(old)] = new
            if self.in_thread_loop:
                self.loop_defs.append((old, op))
        return results

    def flush(self):
        ops, self.stretch = self.stretch, []
        if not ops:
            return
        with self.b.for_(self.b.index(0), self.b.index(self.kernel.threads)) as tid:
            self.vmap[id(self.tid)] = tid
            self.in_thread_loop, self.loop_defs = True, []
            for op in ops:
                self.clone(op)
            self.in_thread_loop = False
        for old, op in self.loop_defs:     # values of a thread loop are gone outside it
            self.vmap[id(old)] = _Poison(op)

    def body(self, ops):
        for op in ops:
            if op.name == "gpu.barrier":
                self.flush()
            elif op.name == "gpu.return":
                self.flush()
            elif op.name == "gpu.thread_id":
                self.tid = op.results[0]
            elif op.name == "gpu.block_id":
                self.vmap[id(op.results[0])] = self.block
            elif op.name == "memref.get_global":
                self.vmap[id(op.results[0])] = self.buffers[op.props["name"]]
            elif _has_barrier(op):
                if op.name not in ("scf.for", "scf.if") or op.results:
                    raise ValueError(f"kernel {self.kernel.name}: {op.name} around a barrier is not a "
                                     "thread-uniform loop/branch without results")
                self.flush()
                uniform = [self.value(v) for v in op.operands]
                if any(isinstance(v, _Poison) or id(v) in self.varying for v in uniform):
                    raise ValueError(f"kernel {self.kernel.name}: {op.name} around a barrier depends on a thread value")
                self._uniform_region_op(op, uniform)
            elif op.name.startswith(PURE_PREFIXES) and not self.stretch_uses(op):
                self.clone(op)
            else:
                self.stretch.append(op)

    def stretch_uses(self, op):
        pending = {id(r) for o in self.stretch for r in o.results}
        return any(id(v) in pending or id(v) == id(self.tid) or isinstance(self.vmap.get(id(v)), _Poison)
                   for v in op.operands)

    def _uniform_region_op(self, op, operands):
        def fill(blk):
            self.body(blk.ops[:-1])
            self.flush()
            self.b.op("scf.yield")

        regions = self.copy_regions(op, fill)
        self.b.append(emit.Op(op.name, operands, [], op.props, op.attrs, regions))


class _Poison:
    """Stands for a thread value after its thread loop ended (a contract violation if used)."""

    def __init__(self, op):
        self.op = op

    @property
    def name(self):
        raise ValueError(f"a value of {self.op.name} is used across a gpu.barrier (kernel contract)")


def lower(gpu_stage, entry):
    """GpuStage -> CpuStage: ``func.func @entry(params...) -> i32`` (text verified)."""
    kernel = gpu_stage.kernel
    low = _Lowering(kernel)
    b = low.b
    func_op = kernel.func
    arg_types = [a.type for a in func_op.regions[0][0].args]

    def body(args):
        for old, new in zip(func_op.regions[0][0].args, args):
            low.vmap[id(old)] = new
        low.buffers = {}
        for g in kernel.globals:
            shape_elem = g.props["type"].split("<", 1)[1].rsplit(",", 1)[0]
            low.buffers["@" + g.props["sym_name"].strip('"')] = b.op(
                "memref.alloca", [], [f"memref<{shape_elem}>"],
                props={"operandSegmentSizes": emit.attr_dense([0, 0], "i32"), "alignment": emit.attr_int(16)})
        grid = kernel.grid()[0]
        with b.for_(b.index(0), b.index(grid)) as block:
            low.block = block
            low.body(func_op.regions[0][0].ops)
            low.flush()
        b.op("func.return", [b.const(0, "i32")])
    new_func = emit.func(b, entry, arg_types, ["i32"], body)
    text = emit.module([new_func])
    return CpuStage(gpu_stage.spec, entry, mlir_opt(text, [], "cpu stage"))
