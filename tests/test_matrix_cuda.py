"""The CUDA realization of the matrix-state scan (``tir_schedules.matrix_gpu``), without a GPU.

Checked here: the kernel builds for sm_90 at the real shapes (GLA-like H=16, K=V=64; Mamba-2's
H=24, K=128, V=64; Mamba-1's selective scan as a matrix scan, K=N=16, V=1536, channel-major;
channel-major and skip/gate variants) and ptxas accepts it without spills; and its algorithm,
emulated on the CPU phase by phase in both thread orders (``tir_schedules.emulate``), matches
the float64 reference ``matrix_scan`` (outputs poisoned with NaN first) over odd lengths, both
directions, h0, the last state, every decay (the selective one with and without dt_bias and
softplus), skip and gate with every decay, both layouts, broadcast operands (B/C shared across
heads or per head), fp16/bf16 and a symbolic batch/L built once; and the Mamba-1 instance run on
a selective scan's own buffers matches ``selective_scan``.  Emulation runs small K/V.

STILL TO DO: the GPU run itself (results and timing on an H100/H200) has not happened; nothing
here executes the kernel on a GPU.
"""
import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir import Var

import tir_schedules
from harness import NP_DTYPES, assert_close, run
from scanweaver_core.reference import matrix_scan, selective_scan
from scanweaver_core.spec import SELECTIVE_AS_MATRIX, AffineScanSpec, MatrixScanSpec, SelectiveScanSpec
from tir_schedules import cuda_check, matrix_gpu
from tir_schedules.emulate import BothOrders, emulate_gpu


def _opaque_reversed_ids(func):
    """Work around a TVM 0.27 bug that the reverse-order emulation trips: IterMapSimplify (run by
    FlattenBuffer on buffer indices) rewrites floordiv/floormod of a negatively scaled loop var
    wrongly, e.g. ``(3 - tx) // 2`` to ``tx // -2 + 1``, and the reversed thread id
    ``nt - 1 - tx`` divided by ``v_tile`` or a staging width is exactly that.  The id is read
    from a buffer holding ``nt - 1 - t`` instead, which no simplifier sees through."""
    extents = []
    tvm_ffi.structural_map(func.body, [(tirx.For, lambda f: extents.append(int(f.extent)) or f
                                        if f.loop_var.name == "tx" else f)])
    assert extents and len(set(extents)) == 1, "no (or mixed) emulated thread loops found"
    nt = extents[0]
    perm = tirx.decl_buffer((nt,), "int32", "reversed_tx")

    def loop(f):
        if f.loop_var.name != "tx":
            return f
        tx = f.loop_var
        body = tvm_ffi.structural_map(f.body, [(Var, lambda v: nt - 1 - tirx.BufferLoad(perm, [tx])
                                                if v.same_as(tx) else v)])
        return tirx.For(tx, f.min, f.extent, f.kind, body, annotations=f.annotations, step=f.step)

    i = Var("i", "int32")
    init = tirx.For(i, tirx.const(0, "int32"), tirx.const(nt, "int32"), tirx.ForKind.SERIAL,
                    tirx.BufferStore(perm, nt - 1 - i, [i]))
    body = tvm_ffi.structural_map(func.body, [(tirx.For, loop)])
    return func.with_body(tirx.SeqStmt([tirx.AllocBuffer(perm), init, body]))


class Emulated(BothOrders):
    """``BothOrders`` with the reverse run rebuilt around the TVM bug above."""

    def __init__(self, func):
        def build(f):
            return tvm.compile(f, target="llvm")

        self.forward = build(emulate_gpu(func))
        self.backward = build(_opaque_reversed_ids(emulate_gpu(func, reverse_threads=True)))


def concrete(shape, values):
    return tuple(values[d] if isinstance(d, str) else d for d in shape)


def draw(name, shape, rng, softplus=False):
    """One operand: a decay g in [0.5, 1), dt positive (any sign before a softplus), A < 0
    (a contracting selective decay), the rest 0.5 N(0, 1)."""
    if name == "g":
        return rng.uniform(0.5, 1.0, shape)
    if name == "dt":
        return rng.standard_normal(shape) if softplus else rng.uniform(0.05, 0.6, shape)
    if name == "A":
        return -rng.uniform(0.5, 2.0, shape)
    return 0.5 * rng.standard_normal(shape)


def check(kernel, spec, rng, **values):
    """Random operands at ``values`` (for the symbolic extents); o and last vs float64."""
    x = {}
    for name, shape in spec.operand_shapes().items():
        dtype = NP_DTYPES[spec.operand_dtypes()[name]]
        x[name] = draw(name, concrete(shape, values), rng, spec.dt_softplus).astype(dtype)
    f64 = {n: a.astype(np.float64) for n, a in x.items()}
    want = matrix_scan(f64["q"], f64["k"], f64["v"], f64.get("g", f64.get("dt")),
                       decay=None if spec.decay == "none" else spec.decay,
                       h0=f64.get("h0"), reverse=spec.reverse,
                       return_last_state=spec.return_last_state, A=f64.get("A"),
                       dt_bias=f64.get("dt_bias"), dt_softplus=spec.dt_softplus, D=f64.get("D"),
                       z=f64.get("z"), layout=spec.layout)
    want = want if spec.return_last_state else (want,)
    shapes = [concrete(spec.out_shape, values), concrete(spec.state_shape, values)]
    got = run(kernel, [x[n] for n in spec.operand_names()], shapes[:len(want)], spec.dtype)
    for name, g, w in zip(("o", "last"), got, want):
        assert_close(g, w, spec.dtype, f"{name} at {values or 'static'} ({spec})")


def spec_of(batch, heads, length, key, value, **kw):
    return MatrixScanSpec.create(batch, heads, length, key, value, **kw)


# -- CUDA build and ptxas at the real shapes ---------------------------------------------------

REAL = {
    "gla-key": (spec_of(1, 16, 2048, 64, 64, decay="key", has_h0=True, return_last_state=True),
                {"v_tile": 8, "col_threads": 8, "t_tile": 16}),
    "mamba2-bf16": (spec_of(1, 24, 2048, 128, 64, decay="scalar", dtype="bfloat16",
                            q_shape=(1, 1, 2048, 128), k_shape=(1, 1, 2048, 128)),
                    {"v_tile": 8, "col_threads": 16, "t_tile": 16}),
    "retention-fp16-reverse": (spec_of(2, 16, 2048, 64, 64, decay="scalar", dtype="float16",
                                       g_shape=(1, 16, 1, 1), reverse=True), None),
    "symbolic-value": (spec_of("batch", 16, "L", 64, 64, decay="value", has_h0=True,
                               return_last_state=True), None),
    # Mamba-1 (1 x 1536 x 1024, N=16, D, z, delta_bias, softplus) as a matrix scan, same bytes
    "mamba1": (SelectiveScanSpec(1, 1536, 1024, 16, 0, True, True, True, True).as_matrix(),
               {"v_tile": 8, "col_threads": 4, "t_tile": 32}),
    "mamba1-groups-bf16-symbolic": (SelectiveScanSpec("batch", 1536, "L", 16, 4, True, True, True, True,
                                                      True, "bfloat16", True).as_matrix(), None),
    "gla-key-channel-major-skip-gate": (spec_of(1, 16, 2048, 64, 64, decay="key", layout="channel_major",
                                                has_skip=True, has_gate=True, has_h0=True,
                                                return_last_state=True), None),
}


@pytest.mark.parametrize("name", sorted(REAL))
def test_ptxas_real_shapes(name):
    spec, expected = REAL[name]
    config = matrix_gpu.default_config(spec)
    if expected is not None:
        assert config == expected
    regs, smem = matrix_gpu.footprint(spec, **config)
    assert regs <= matrix_gpu.PREFETCH_REGS and smem <= matrix_gpu.SHARED_BYTES
    source, ptx, report = cuda_check.check_kernel(tir_schedules.realize(spec, cuda_check.SM90))
    assert "__global__" in source and ".entry" in ptx
    assert source.count("__syncthreads") == 2          # two barriers per time tile
    if spec.is_symbolic:
        assert "int64_t L" in source and "int64_t batch" in source
    assert report.spill_stores == 0 and report.spill_loads == 0, report.text
    # footprint rounds each buffer up to ptxas's 64-byte alignment; TVM trims a channel-major
    # tile to the words used (its last row's padding word), so there it is an upper bound
    assert report.shared_bytes <= smem <= 48 * 1024, report.text
    if spec.layout == "time_major":
        assert report.shared_bytes == smem, report.text
    assert report.registers <= 255, report.text


# -- the algorithm, emulated -------------------------------------------------------------------

SMALL = dict(v_tile=4, col_threads=2, t_tile=8)   # 8 threads, K padded to the rows, a V overhang
OVERHANG = dict(v_tile=3, col_threads=4, t_tile=5)  # 12 threads: tiles of items that overhang them
CM = "channel_major"

CASES = {  # spec, config, lengths (the symbolic L's values; a static L runs once)
    "none-h0-last": (spec_of(2, 3, 37, 5, 6, has_h0=True, return_last_state=True), SMALL),
    "scalar-reverse-broadcast": (spec_of(2, 3, 37, 5, 6, decay="scalar", reverse=True,
                                         return_last_state=True, q_shape=(1, 1, 37, 5),
                                         k_shape=(2, 1, 37, 5), g_shape=(1, 3, 1, 1)), SMALL),
    "key-symbolic-L": (spec_of(1, 2, "L", 4, 3, decay="key", has_h0=True, return_last_state=True,
                               v_shape=(1, 1, "L", 3)), dict(v_tile=2, col_threads=2, t_tile=8)),
    "value-reverse-h0": (spec_of(2, 2, 23, 3, 5, decay="value", reverse=True, has_h0=True,
                                 return_last_state=True, g_shape=(1, 2, 23, 5)),
                         dict(v_tile=3, col_threads=4, t_tile=5)),
    "key-fp16": (spec_of(1, 2, 37, 6, 4, decay="key", dtype="float16", has_h0=True,
                         return_last_state=True), SMALL),
    "scalar-bf16-reverse": (spec_of(1, 3, 37, 4, 4, decay="scalar", dtype="bfloat16", reverse=True,
                                    q_shape=(1, 1, 37, 4), k_shape=(1, 1, 37, 4)), SMALL),
    # the selective decay (Mamba-1's), both layouts; B/C (k, q) shared across heads or per head
    "selective-cm-everything-reverse": (spec_of(2, 3, 37, 5, 6, decay="selective", layout=CM, reverse=True,
                                                has_h0=True, return_last_state=True, has_dt_bias=True,
                                                dt_softplus=True, has_skip=True, has_gate=True,
                                                q_shape=(2, 1, 37, 5), k_shape=(2, 1, 37, 5)), SMALL),
    "selective-cm-per-head-fp16": (spec_of(2, 2, 23, 3, 5, decay="selective", layout=CM, dtype="float16",
                                           has_h0=True, return_last_state=True, dt_softplus=True,
                                           has_gate=True), OVERHANG),
    "selective-cm-bias-bf16": (spec_of(1, 3, 37, 4, 4, decay="selective", layout=CM, dtype="bfloat16",
                                       has_dt_bias=True, has_skip=True, q_shape=(1, 1, 37, 4),
                                       k_shape=(1, 1, 37, 4)), SMALL),
    "selective-cm-symbolic-L": (spec_of(1, 2, "L", 4, 3, decay="selective", layout=CM, has_dt_bias=True,
                                        dt_softplus=True, has_h0=True, return_last_state=True,
                                        q_shape=(1, 1, "L", 4), k_shape=(1, 2, "L", 4)),
                                dict(v_tile=2, col_threads=2, t_tile=8)),
    "selective-tm-everything-reverse": (spec_of(2, 3, 37, 5, 6, decay="selective", reverse=True, has_h0=True,
                                                return_last_state=True, has_dt_bias=True, dt_softplus=True,
                                                has_skip=True, has_gate=True, q_shape=(1, 1, 37, 5)), SMALL),
    "selective-tm-plain": (spec_of(1, 2, 23, 4, 3, decay="selective", return_last_state=True,
                                   q_shape=(1, 1, 23, 4), k_shape=(1, 1, 23, 4)), OVERHANG),
    # channel-major and skip / gate with the other decays
    "none-cm-skip-gate": (spec_of(2, 3, 37, 5, 6, layout=CM, has_h0=True, return_last_state=True,
                                  has_skip=True, has_gate=True), SMALL),
    "scalar-cm-constant-gate-reverse": (spec_of(2, 3, 37, 5, 6, decay="scalar", layout=CM, reverse=True,
                                                return_last_state=True, q_shape=(1, 1, 37, 5),
                                                k_shape=(2, 1, 37, 5), g_shape=(1, 3, 1, 1),
                                                has_gate=True), SMALL),
    "key-cm-fp16-skip": (spec_of(1, 2, 37, 6, 4, decay="key", layout=CM, dtype="float16", has_h0=True,
                                 return_last_state=True, has_skip=True), SMALL),
    "value-cm-reverse-skip-gate": (spec_of(2, 2, 23, 3, 5, decay="value", layout=CM, reverse=True,
                                           has_h0=True, return_last_state=True, g_shape=(1, 2, 23, 5),
                                           has_skip=True, has_gate=True), OVERHANG),
    "scalar-tm-bf16-skip-gate": (spec_of(1, 3, 37, 4, 4, decay="scalar", dtype="bfloat16", reverse=True,
                                         has_skip=True, has_gate=True), SMALL),
    "key-tm-gate": (spec_of(2, 2, 37, 5, 6, decay="key", has_h0=True, return_last_state=True,
                            has_gate=True), SMALL),
    "value-tm-skip": (spec_of(2, 2, 23, 3, 5, decay="value", return_last_state=True, has_skip=True),
                      OVERHANG),
}
LENGTHS = {"key-symbolic-L": (1, 2, 3, 37, 1025), "selective-cm-symbolic-L": (1, 2, 37)}


@pytest.mark.parametrize("name", list(CASES))
def test_emulated_matches_reference(name):
    spec, config = CASES[name]
    kernel = Emulated(matrix_gpu.generate(spec, **config))
    rng = np.random.default_rng(len(name))
    for length in LENGTHS.get(name, (None,)):
        check(kernel, spec, rng, **({} if length is None else {"L": length}))


def test_mamba1_instance_on_the_selective_buffers():
    """``SelectiveScanSpec.as_matrix``: the matrix kernel (default config) run on a selective
    scan's own arrays, reshaped, is ``selective_scan`` (groups: B/C per head; every option)."""
    sel = SelectiveScanSpec(2, 8, 37, 4, 2, True, True, True, True, True, "float32", True)
    spec = sel.as_matrix()
    kernel = Emulated(tir_schedules.realize(spec, cuda_check.SM90))
    rng = np.random.default_rng(11)
    shapes = {"u": (2, 8, 37), "delta": (2, 8, 37), "A": (8, 4), "B": sel.bc_shape, "C": sel.bc_shape,
              "D": (8,), "z": (2, 8, 37), "delta_bias": (8,), "h0": (2, 8, 4)}
    x = {n: draw(SELECTIVE_AS_MATRIX[n], shape, rng, softplus=True).astype(np.float32)
         for n, shape in shapes.items()}
    by_matrix_name = {SELECTIVE_AS_MATRIX[n]: a for n, a in x.items()}
    inputs = [by_matrix_name[m].reshape(shape) for m, shape in spec.operand_shapes().items()]
    o, last = run(kernel, inputs, [spec.out_shape, spec.state_shape], "float32")
    want = selective_scan(*(x[n].astype(np.float64) for n in ("u", "delta", "A", "B", "C", "D", "z",
                                                               "delta_bias")),
                          delta_softplus=True, h0=x["h0"].astype(np.float64), return_last_state=True)
    assert_close(o.reshape(2, 8, 37), want[0], "float32", "out")
    assert_close(last.reshape(2, 8, 4), want[1], "float32", "last_state")


SYMBOLIC = {
    "value-reverse": spec_of("batch", 2, "L", 3, 5, decay="value", reverse=True, has_h0=True,
                             return_last_state=True, q_shape=(1, 2, "L", 3)),
    # Mamba-1 with groups, as a matrix scan (channel-major, B/C per head)
    "mamba1-groups": SelectiveScanSpec("batch", 4, "L", 3, 2, True, True, True, True, True,
                                       "float32", True).as_matrix(),
}


@pytest.mark.parametrize("name", list(SYMBOLIC))
def test_symbolic_batch_and_length_one_kernel(name):
    """One build for ``batch`` and ``L`` unknown, run at two sizes (L=1 included)."""
    spec = SYMBOLIC[name]
    kernel = Emulated(matrix_gpu.generate(spec, v_tile=4, col_threads=2, t_tile=4))
    rng = np.random.default_rng(7)
    for batch, length in [(1, 1), (3, 37)]:
        check(kernel, spec, rng, batch=batch, L=length)


def test_default_config_emulated():
    spec = spec_of(1, 2, 3, 16, 16, decay="scalar", has_h0=True, return_last_state=True)
    config = matrix_gpu.default_config(spec)
    assert config["t_tile"] == 4                     # below 2L for a short scan
    check(Emulated(tir_schedules.realize(spec, cuda_check.SM90)), spec, np.random.default_rng(3))


def test_emulation_catches_a_missing_barrier(monkeypatch):
    """The two-order check is armed: without the barrier after staging, threads read shared
    words that others have not written yet, and the orders disagree."""
    real, calls = matrix_gpu.barrier, []

    def all_but_the_first():
        calls.append(1)
        if len(calls) > 1:
            real()

    monkeypatch.setattr(matrix_gpu, "barrier", all_but_the_first)
    spec, config = CASES["none-h0-last"]
    kernel = Emulated(matrix_gpu.generate(spec, **config))
    with pytest.raises(AssertionError, match="race"):
        check(kernel, spec, np.random.default_rng(0))


def test_applies_realize_and_bad_configs():
    spec = spec_of(1, 2, 8, 4, 4)
    assert matrix_gpu.applies(spec) and not matrix_gpu.applies(AffineScanSpec.create((4, 8)))
    assert tir_schedules.REALIZATIONS["matrix_gpu"] is matrix_gpu
    func = tir_schedules.realize(spec, cuda_check.SM90)
    assert [p.name for p in func.params] == ["q", "k", "v", "o"]
    with_g = spec_of(1, 2, 8, 4, 4, decay="key", has_h0=True, return_last_state=True)
    assert [p.name for p in tir_schedules.realize(with_g, cuda_check.SM90).params] == \
        ["q", "k", "v", "g", "h0", "o", "last"]
    mamba = SelectiveScanSpec(1, 8, 8, 4, 2, True, True, True, True, True, "float32", True).as_matrix()
    assert [p.name for p in tir_schedules.realize(mamba, cuda_check.SM90).params] == \
        ["q", "k", "v", "dt", "A", "dt_bias", "D", "z", "h0", "o", "last"]
    with pytest.raises(ValueError, match="v_tile"):
        matrix_gpu.generate(spec, v_tile=64, col_threads=32)
    with pytest.raises(ValueError, match="t_tile"):
        matrix_gpu.generate(spec, t_tile=0)
