"""AMX's ``tdpbf16ps`` as a TensorIntrin: a 32 x 32 float32 tile of C += A (32 x depth, bf16)
times B (depth x 32, bf16, packed in k pairs), for ``dense_cpu`` on AMX-BF16 CPUs (Sapphire,
Emerald, Granite Rapids).

TVM 0.27 ships no AMX intrinsic, but its LLVM emits AMX from ``T.call_llvm_intrin``.  C's four
16 x 16 tiles stay in tile registers over the whole depth (tmm0-3), two A tiles (16 rows x 32
k) and two B tiles (16 k pairs x 32 columns) are loaded per 32 of k (tmm4-7), and each step
does four ``tdpbf16ps`` of 16 x 16 x 32: 512 multiply-adds an instruction.  B is read in
``bf16_dot``'s pairs layout (``[j // 32, k // 2, j % 32, k % 2]``): a B tile's row is one k pair
of 16 columns, the layout AMX wants.

Two things the hardware asks of the process and the thread:
- the tile configuration (8 tiles of 16 rows x 64 bytes) is per thread: each tensorized call
  loads it (``ldtilecfg`` of a constant, from a small LLVM IR function the kernels import), so
  any thread of TVM's pool may run any tile;
- Linux gives a process AMX state only when asked (``arch_prctl(ARCH_REQ_XCOMP_PERM)``); until
  then the first tile instruction kills it with SIGILL.  ``request_permission`` asks, once per
  process, before a kernel for this host is built.
"""
import ctypes
import functools

import tvm

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T
from tvm.target import codegen

ROWS = COLS = 32   # C's tile: 2 x 2 AMX tiles of 16 x 16 float32
STEP = 32          # k per tdpbf16ps (16 pairs)
CONFIGURE = "scanweaver_amx_configure"
_CONFIG = bytes([1] + [0] * 15 + [64, 0] * 8 + [0] * 16 + [16] * 8 + [0] * 8)   # palette 1, 8 x (16 rows, 64 bytes)
_CONFIG_BYTES = "".join(f"\\{b:02X}" for b in _CONFIG)
LLVM_IR = f"""
@scanweaver_amx_config = linkonce_odr constant [64 x i8] c"{_CONFIG_BYTES}"
define linkonce_odr void @{CONFIGURE}() #0 {{
  call void @llvm.x86.ldtilecfg(ptr @scanweaver_amx_config)
  ret void
}}
declare void @llvm.x86.ldtilecfg(ptr)
attributes #0 = {{ alwaysinline "target-features"="+amx-tile" }}
"""
_ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA, _SYS_ARCH_PRCTL = 0x1023, 18, 158


def available(target):
    """The target's CPU has AMX-BF16 (and so AMX tiles); False where LLVM does not know it."""
    try:
        return bool(codegen.target_has_features("amx-bf16", target))
    except (RuntimeError, ValueError):
        return False


@functools.lru_cache(maxsize=None)
def host_has_amx():
    """This machine's CPU (as LLVM names it) has AMX-BF16."""
    from scanweaver_core.targets import host_target  # pylint: disable=import-outside-toplevel

    return bool(codegen.target_has_features("amx-bf16", host_target()))


@functools.lru_cache(maxsize=None)
def request_permission():
    """Ask Linux for this process's AMX tile state (once); a clear error where it refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) != 0:
        raise RuntimeError(
            f"AMX: the kernel refused this process AMX tile state (arch_prctl(ARCH_REQ_XCOMP_PERM): "
            f"errno {ctypes.get_errno()}; Linux 5.16+ grants it); compile for a target without AMX, "
            f"e.g. {{'kind': 'llvm', 'mcpu': ..., 'mattr': ['-amx-bf16']}}")


class _Tiles:
    """The tile instructions the kernel uses, on flat views of its buffers (offsets and strides
    in elements, as the hardware sees memory): AMX's, through LLVM."""

    @staticmethod
    def load(tile, flat, offset, stride):
        _llvm("tileloadd64", T.int8(tile), T.address_of(flat[offset]), T.int64(stride * _bytes(flat)))

    @staticmethod
    def store(tile, flat, offset, stride):
        _llvm("tilestored64", T.int8(tile), T.address_of(flat[offset]), T.int64(stride * _bytes(flat)))

    @staticmethod
    def dot(c, a, b):
        _llvm("tdpbf16ps", T.int8(c), T.int8(a), T.int8(b))


class EmulatedTiles:
    """The same instructions as TIR loops over a tile file in local buffers (tmm0-3: float32
    16 x 16, tmm4-7: bf16 16 x 32), with ``tdpbf16ps``'s definition (C[m, n] += A[m, 2p] *
    B[p, 2n] + A[m, 2p + 1] * B[p, 2n + 1]): ``intrin(depth, EmulatedTiles)`` runs the very
    kernel ``dense_cpu`` schedules, addresses and all, on a CPU without AMX (the tests')."""

    def __init__(self):
        self.acc = T.alloc_buffer((4, 16, 16), "float32", scope="local")
        self.ins = T.alloc_buffer((4, 16, 32), "bfloat16", scope="local")

    def load(self, tile, flat, offset, stride):
        into, width = (self.acc, 16) if tile < 4 else (self.ins, 32)
        with T.grid(16, width) as (r, e):
            T.buffer_store(into, flat[offset + r * stride + e], [tile % 4, r, e])

    def store(self, tile, flat, offset, stride):
        with T.grid(16, 16) as (r, e):
            T.buffer_store(flat, self.acc[tile, r, e], [offset + r * stride + e])

    def dot(self, c, a, b):
        with T.grid(16, 16, 32) as (m, n, p):
            T.buffer_store(self.acc, self.acc[c, m, n] + T.Cast("float32", self.ins[a - 4, m, p])
                           * T.Cast("float32", self.ins[b - 4, p // 2, n * 2 + p % 2]), [c, m, n])


def _llvm(name, *args):
    T.evaluate(T.call_llvm_intrin("void", f"llvm.x86.{name}", *args))


def _bytes(buffer):
    return tvm.DataType(str(buffer.dtype)).bits // 8


def _program(tiles, a, b, c, depth):
    """The kernel: C's 2 x 2 tiles (tmm0-3) loaded, per 32 of k A's rows 0-15 and 16-31 (tmm4-5)
    and B's columns 0-15 and 16-31 (tmm6-7) loaded and multiplied, C stored.  Written with the
    IR builder (the tile numbers are Python constants: AMX encodes them in the instruction)."""
    ops = tiles()
    flat = [T.decl_buffer((1 << 30,), x.dtype, data=x.data, elem_offset=x.elem_offset, scope=x.scope())
            for x in (a, b, c)]
    fa, fb, fc = flat
    sa, sb, sc = a.strides[0], b.strides[0], c.strides[0]
    if tiles is _Tiles:
        T.evaluate(T.call_extern("void", CONFIGURE))
    for t in range(4):
        ops.load(t, fc, t // 2 * 16 * sc + t % 2 * 16, sc)
    with T.serial(depth // STEP) as s:
        for t in range(2):
            ops.load(4 + t, fa, t * 16 * sa + s * STEP, sa)
            ops.load(6 + t, fb, s * (STEP // 2) * sb + t * 32, sb)
        for t in range(4):
            ops.dot(t, 4 + t // 2, 6 + t % 2)
    for t in range(4):
        ops.store(t, fc, t // 2 * 16 * sc + t % 2 * 16, sc)


@functools.lru_cache(maxsize=None)
def intrin(depth, tiles=_Tiles):
    """The TensorIntrin's name for a ``depth`` (a multiple of ``STEP``), registered on first use:
    the whole reduction is one call, so C never leaves the tile registers.  ``tiles``: the
    instructions (``EmulatedTiles`` to run it without AMX)."""
    assert depth % STEP == 0
    name = f"scanweaver_tdpbf16ps_{ROWS}x{COLS}x{depth}" + ("" if tiles is _Tiles else "_emulated")

    @T.prim_func(s_tir=True)
    def desc(a: T.Buffer((ROWS, depth), "bfloat16", offset_factor=1),
             b: T.Buffer((depth // 2, COLS, 2), "bfloat16", offset_factor=1),
             c: T.Buffer((ROWS, COLS), "float32", offset_factor=1, scope="local")):
        with T.sblock("root"):
            T.reads(c[0:ROWS, 0:COLS], a[0:ROWS, 0:depth], b[0:depth // 2, 0:COLS, 0:2])
            T.writes(c[0:ROWS, 0:COLS])
            for i, j, k in T.grid(ROWS, COLS, depth):
                with T.sblock("update"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    c[vi, vj] = c[vi, vj] + T.Cast("float32", a[vi, vk]) * T.Cast("float32", b[vk // 2, vj, vk % 2])

    @T.prim_func(s_tir=True)
    def impl(a_: T.handle, b_: T.handle, c_: T.handle):
        sa, sb, sc = T.int32(), T.int32(), T.int32()
        a = T.match_buffer(a_, (ROWS, depth), "bfloat16", offset_factor=1, strides=[sa, 1])
        b = T.match_buffer(b_, (depth // 2, COLS, 2), "bfloat16", offset_factor=1, strides=[sb, 2, 1])
        c = T.match_buffer(c_, (ROWS, COLS), "float32", offset_factor=1, scope="local", strides=[sc, 1])
        with T.sblock("root"):
            T.reads(c[0:ROWS, 0:COLS], a[0:ROWS, 0:depth], b[0:depth // 2, 0:COLS, 0:2])
            T.writes(c[0:ROWS, 0:COLS])
            _program(tiles, a, b, c, depth)

    TensorIntrin.register(name, desc, impl, override=True)
    return name


def import_configure(sch, loop):
    """Carry ``CONFIGURE``'s LLVM IR on ``loop`` (linked by TVM's LLVM codegen, once a module)."""
    sch.annotate(loop, "pragma_import_llvm", LLVM_IR)
