"""AVX512-BF16's ``vdpbf16ps`` as a TensorIntrin: 16 float32 accumulators += a bf16 pair times
16 bf16 pairs (``c[j] += a[0] * b[j, 0] + a[1] * b[j, 1]``), for ``dense_cpu`` and MetaSchedule.

One instruction does 32 multiply-adds on bf16 operands where an FMA does 16 on float32 ones, and
reads the weights at half the bytes.  LLVM's intrinsic takes ``<32 x bfloat>``, which TVM's
dtypes cannot spell (its bf16 is ``i16`` in LLVM), so the kernels call a small LLVM IR wrapper
that bitcasts ``<16 x i32>`` (the pairs) to it; a kernel that uses the intrinsic carries the
wrapper as ``pragma_import_llvm`` (``import_wrapper``), and TVM's LLVM codegen links it in
(``linkonce_odr``: once per module, however many kernels carry it).  The weights are packed at
compile time in pairs along k: ``[j // 32, k // 2, j % 32, k % 2]``.
"""
from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T
from tvm.target import codegen

INTRIN = "scanweaver_dpbf16ps_16x2"
LANES = 16
WRAPPER = "scanweaver_dpbf16ps"
LLVM_IR = f"""
define linkonce_odr <16 x float> @{WRAPPER}(<16 x float> %acc, <16 x i32> %a, <16 x i32> %b) #0 {{
  %a2 = bitcast <16 x i32> %a to <32 x bfloat>
  %b2 = bitcast <16 x i32> %b to <32 x bfloat>
  %r = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %acc, <32 x bfloat> %a2, <32 x bfloat> %b2)
  ret <16 x float> %r
}}
declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)
attributes #0 = {{ alwaysinline "target-features"="+avx512f,+avx512bf16" }}
"""


def available(target):
    """The target's CPU has AVX512-BF16 (Zen 4, Sapphire/Emerald Rapids); False where LLVM
    does not know it."""
    try:
        return bool(codegen.target_has_features("avx512bf16", target))
    except (RuntimeError, ValueError):
        return False


@T.prim_func(s_tir=True)
def _desc(a: T.Buffer((2,), "bfloat16", offset_factor=1), b: T.Buffer((LANES, 2), "bfloat16", offset_factor=1),
          c: T.Buffer((LANES,), "float32", offset_factor=1, scope="local")):
    with T.sblock("root"):
        T.reads(c[0:LANES], a[0:2], b[0:LANES, 0:2])
        T.writes(c[0:LANES])
        for j, k in T.grid(LANES, 2):
            with T.sblock("update"):
                vj, vk = T.axis.remap("SR", [j, k])
                c[vj] = c[vj] + T.Cast("float32", a[vk]) * T.Cast("float32", b[vj, vk])


@T.prim_func(s_tir=True)
def _impl(a: T.Buffer((2,), "bfloat16", offset_factor=1), b: T.Buffer((LANES, 2), "bfloat16", offset_factor=1),
          c: T.Buffer((LANES,), "float32", offset_factor=1, scope="local")):
    with T.sblock("root"):
        T.reads(c[0:LANES], a[0:2], b[0:LANES, 0:2])
        T.writes(c[0:LANES])
        pair = T.decl_buffer((1,), "int32", data=a.data, elem_offset=a.elem_offset // 2)
        pairs = T.decl_buffer((LANES,), "int32", data=b.data, elem_offset=b.elem_offset // 2)
        c[T.Ramp(0, 1, LANES)] = T.call_pure_extern("float32x16", WRAPPER, c[T.Ramp(0, 1, LANES)],
                                                     T.broadcast(pair[0], LANES), pairs[T.Ramp(0, 1, LANES)])


TensorIntrin.register(INTRIN, _desc, _impl, override=True)


def import_wrapper(sch, loop):
    """Carry the wrapper's LLVM IR on ``loop`` (a ``pragma_`` annotation becomes the
    ``AttrStmt`` TVM's LLVM codegen links from)."""
    sch.annotate(loop, "pragma_import_llvm", LLVM_IR)


def pairs_layout(nr):
    """The packed weight's index map: ``[..., k, j] -> [..., j // nr, k // 2, j % nr, k % 2]``."""
    def panels(*i):
        return (*i[:-2], i[-1] // nr, i[-2] // 2, i[-1] % nr, i[-2] % 2)
    return panels

