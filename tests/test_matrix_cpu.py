"""Matrix-state scan, CPU kernel (llvm) against the float64 reference on fresh random operands
with NaN-poisoned outputs: odd lengths, both directions, h0 and the last state, every decay
(Mamba-1's selective one with its dt bias and softplus), the skip and the gate, both layouts,
broadcast operands, fp16/bf16 inputs, symbolic batch and L, decays that force the direct
recurrence (the rescaled form's fallback), and a selective scan run by both its own kernel and
this one on the same bytes."""
import numpy as np
import pytest
import tvm

from harness import NP_DTYPES, assert_close, run
import tir_schedules
from scanweaver_core.reference import matrix_scan, selective_scan
from scanweaver_core.spec import DECAYS, LAYOUTS, SELECTIVE_AS_MATRIX, MatrixScanSpec, SelectiveScanSpec
from test_selective import ORDER as SELECTIVE_ORDER
from test_selective import operands as selective_operands
from tir_schedules import matrix_cpu, selective_cpu

PARAMETERS = ("A", "dt_bias", "D")
EPILOGUE = dict(has_skip=True, has_gate=True)
SELECTIVE_ALL = dict(decay="selective", has_dt_bias=True, dt_softplus=True, **EPILOGUE)


def spec_of(length=37, batch=2, heads=3, key=5, value=7, **options):
    return MatrixScanSpec.create(batch, heads, length, key, value, **options)


def build(spec, **config):
    func = matrix_cpu.generate(spec, **{**matrix_cpu.default_config(spec), **config})
    assert func.attrs["global_symbol"] == "scanweaver_scan" and func.attrs["tirx.noalias"]
    return tvm.compile(func, target=tir_schedules.resolve_target("llvm")).mod


def operands(spec, rng, batch=None, length=None, g_range=(0.6, 1.0)):
    """Random operands at the spec's buffer shapes, in the input dtype (the parameters A,
    dt_bias, D float32; ``batch``/``length`` fill in symbolic extents); k is scaled so the
    state stays O(1..10) over a thousand steps; the selective decay's dt' lies in ~[0.01, 0.5]
    and A < 0, as in a trained Mamba layer."""
    sizes = {spec.batch: batch, spec.length: length}
    shapes = {n: tuple(sizes.get(d) or d if isinstance(d, str) else d for d in s)
              for n, s in spec.operand_shapes().items()}
    draw = {"q": lambda s: rng.standard_normal(s), "k": lambda s: rng.standard_normal(s) * 0.3,
            "v": rng.standard_normal, "g": lambda s: rng.uniform(*g_range, s),
            "dt": lambda s: rng.uniform(-4.5, 0.0, s) if spec.dt_softplus else rng.uniform(0.01, 0.5, s),
            "A": lambda s: -rng.uniform(0.1, 4.0, s), "dt_bias": lambda s: rng.uniform(-0.3, 0.3, s),
            "D": rng.standard_normal, "z": rng.standard_normal, "h0": rng.standard_normal}
    return {n: draw[n](s).astype(np.float32 if n in PARAMETERS else NP_DTYPES[spec.dtype])
            for n, s in shapes.items()}


def expected(spec, x):
    """The float64 oracle on operands ``x`` (``operands``' names): o, or (o, last)."""
    f64 = {k: v.astype(np.float64) for k, v in x.items()}
    want = matrix_scan(f64["q"], f64["k"], f64["v"], f64.get("g", f64.get("dt")), spec.decay,
                       f64.get("h0"), spec.reverse, spec.return_last_state, A=f64.get("A"),
                       dt_bias=f64.get("dt_bias"), dt_softplus=spec.dt_softplus, D=f64.get("D"),
                       z=f64.get("z"), layout=spec.layout)
    return want if spec.return_last_state else (want,)


def check(kernel, spec, rng, batch=None, length=None, **kw):
    """Run the kernel; compare o (and last) with the reference on the same rounded inputs."""
    x = operands(spec, rng, batch, length, **kw)
    want = expected(spec, x)
    got = run(kernel, [x[n] for n in spec.operand_names()], [w.shape for w in want], spec.dtype)
    for name, g, w in zip(("o", "last"), got, want):
        assert_close(g, w, spec.dtype, f"{name} ({spec})")


@pytest.mark.parametrize("length,decay", [
    (1, "none"), (1, "key"), (2, "scalar"), (2, "value"), (3, "key"), (3, "none"),
    (1000, "value"), (1000, "scalar"), (1025, "none"), (1025, "key"), (1025, "scalar")])
def test_lengths_and_decays(length, decay):
    rng = np.random.default_rng(length)
    spec = spec_of(length, decay=decay, reverse=length % 2 == 1, has_h0=True,
                   return_last_state=True)
    check(build(spec), spec, rng)


@pytest.mark.parametrize("decay", DECAYS)
@pytest.mark.parametrize("reverse", [False, True])
def test_directions_without_h0_or_last(decay, reverse):
    spec = spec_of(decay=decay, reverse=reverse)
    check(build(spec), spec, np.random.default_rng(7))


OVERHANG = dict(vtile=16, lanes=8, rows=3, parts=2, tile=7, chunk=3)  # V tiles overhang V, K % rows


@pytest.mark.parametrize("decay,config,layout", [
    ("key", OVERHANG, "time_major"), ("key", OVERHANG, "channel_major"),
    ("value", OVERHANG, "time_major"), ("value", OVERHANG, "channel_major"),
    ("scalar", dict(vtile=8, lanes=8, rows=8, parts=4, tile=5, chunk=5, prefetch=0), "time_major"),
    ("value", dict(chunk=0), "time_major"),                          # only the direct recurrence
    ("key", dict(chunk=0, rows=4), "channel_major"),
])
def test_configs(decay, config, layout):
    spec = spec_of(61, key=10, value=21, decay=decay, reverse=True, has_h0=True,
                   return_last_state=True, layout=layout)
    check(build(spec, **config), spec, np.random.default_rng(3))


def test_split_value_tiles():
    """One (batch, head): the default splits V across tasks to use both cores."""
    spec = spec_of(300, batch=1, heads=1, key=16, value=64, decay="value", return_last_state=True)
    assert matrix_cpu.default_config(spec)["vtile"] < 64
    check(build(spec), spec, np.random.default_rng(4))


@pytest.mark.parametrize("decay,layout", [("scalar", "time_major"), ("key", "time_major"),
                                          ("key", "channel_major"), ("value", "channel_major")])
def test_fallback_decays(decay, layout):
    """Decays whose running product leaves the rescaled form's range (zeros, a strong decay, a
    growing one): those tiles run the direct recurrence; the others stay rescaled (negative
    decays included)."""
    spec = spec_of(200, key=8, value=16, decay=decay, has_h0=True, return_last_state=True,
                   layout=layout)
    kernel, rng = build(spec), np.random.default_rng(5)
    for g_range in [(0.0, 0.02), (0.0, 1.0), (0.2, 0.4), (1.0, 1.2), (0.97, 1.03), (-1.0, -0.8)]:
        check(kernel, spec, rng, g_range=g_range)


@pytest.mark.parametrize("shapes", [
    dict(q_shape=(1, 3, 37, 5), k_shape=(2, 1, 37, 5), v_shape=(1, 1, 37, 7),
         decay="scalar", g_shape=(1, 3, 1, 1)),            # a retention-like gamma per head
    dict(q_shape=(2, 1, 37, 5), k_shape=(2, 1, 37, 5), decay="scalar",
         g_shape=(2, 3, 37, 1)),                           # Mamba-2: B, C shared by the heads
    dict(decay="key", g_shape=(2, 1, 1, 5)),
    dict(v_shape=(2, 1, 37, 7), decay="value", g_shape=(1, 1, 37, 7)),
])
def test_broadcast_operands(shapes):
    spec = spec_of(reverse=True, has_h0=True, return_last_state=True, **shapes)
    check(build(spec), spec, np.random.default_rng(6))
    if shapes["decay"] != "key":   # channel-major, forward
        spec = spec_of(return_last_state=True, layout="channel_major", **shapes)
        check(build(spec), spec, np.random.default_rng(6))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("decay,layout", [("none", "time_major"), ("key", "time_major"),
                                          ("key", "channel_major")])
def test_half_inputs(dtype, decay, layout):
    """fp16/bf16 operands and outputs, float32 state: within the output dtype's rounding (the
    key decay also through the direct recurrence, which converts the operands where they lie)."""
    spec = spec_of(300, key=16, value=32, decay=decay, has_h0=True, return_last_state=True,
                   dtype=dtype, layout=layout, has_gate=layout == "channel_major")
    kernel, rng = build(spec), np.random.default_rng(8)
    check(kernel, spec, rng)
    if decay == "key":
        check(kernel, spec, rng, g_range=(0.0, 0.05))


@pytest.mark.parametrize("decay,reverse,layout", [
    ("key", True, "time_major"), ("value", False, "time_major"), ("key", False, "channel_major"),
    ("selective", True, "time_major"), ("selective", False, "channel_major")])
def test_symbolic_batch_and_length(decay, reverse, layout):
    """One kernel for every (batch, L), L below, at and past the tile, odd."""
    options = SELECTIVE_ALL if decay == "selective" else dict(decay=decay)
    spec = spec_of("L", batch="batch", key=6, value=20, reverse=reverse, layout=layout,
                   has_h0=True, return_last_state=True,
                   g_shape=("batch", 3, 1, 20) if decay == "value" else None, **options)
    kernel, rng = build(spec), np.random.default_rng(9)
    for batch, length in [(1, 1), (2, 31), (3, 32), (1, 33), (2, 517)]:
        check(kernel, spec, rng, batch=batch, length=length)


@pytest.mark.parametrize("length,decay", [(1, "key"), (2, "value"), (3, "none"),
                                          (1025, "scalar"), (1025, "key")])
def test_channel_major_lengths_and_decays(length, decay):
    """Mamba's layout (time innermost) with the other decays, a skip or a gate on some."""
    spec = spec_of(length, decay=decay, layout="channel_major", reverse=length % 2 == 1,
                   has_h0=True, return_last_state=True, has_skip=length < 3,
                   has_gate=length in (2, 1025))
    check(build(spec), spec, np.random.default_rng(length))


@pytest.mark.parametrize("decay,layout", [("none", "time_major"), ("scalar", "channel_major"),
                                          ("key", "time_major"), ("value", "channel_major")])
def test_skip_and_gate(decay, layout):
    """``o = (q^T S + D v) * silu(z)`` with every decay, also where several row blocks share
    the output rows (the last one applies it) and V tiles overhang V."""
    spec = spec_of(61, key=10, value=21, decay=decay, layout=layout, reverse=decay != "key",
                   has_h0=True, return_last_state=True, **EPILOGUE)
    check(build(spec, rows=4), spec, np.random.default_rng(11))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("length,options", [
    (1, dict(SELECTIVE_ALL, has_h0=True, return_last_state=True)),
    (2, dict(decay="selective", reverse=True, has_h0=True, return_last_state=True)),
    (3, dict(decay="selective", dt_softplus=True, has_gate=True, reverse=True)),
    (37, dict(decay="selective", has_dt_bias=True, has_skip=True, return_last_state=True)),
    (1025, dict(SELECTIVE_ALL, reverse=True, has_h0=True, return_last_state=True))])
def test_selective_lengths_and_options(length, options, layout):
    """Mamba-1's decay exp(dt' A), dt' = softplus(dt + dt_bias) (each optional), with and
    without the skip, the gate, h0, the last state; V tiles overhang V (21 = 16 + 5)."""
    spec = spec_of(length, key=5, value=21, layout=layout, **options)
    check(build(spec), spec, np.random.default_rng(length))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("config", [
    dict(vtile=16, lanes=8, rows=2, parts=2, tile=7, prefetch=1),      # 3 row blocks, K % rows
    dict(vtile=32, lanes=16, rows=16, parts=4, tile=5, prefetch=1, locality=3)])
def test_selective_configs(config, layout):
    spec = spec_of(61, key=5, value=21, layout=layout, reverse=True, has_h0=True,
                   return_last_state=True, **SELECTIVE_ALL)
    check(build(spec, **config), spec, np.random.default_rng(12))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("bc_heads", [1, 3])
def test_selective_bc_shared_or_per_head(bc_heads, layout):
    """Mamba's B and C (k and q) shared by every head (one group) or one per head (groups)."""
    bc = (2, bc_heads, 37, 5)
    spec = spec_of(q_shape=bc, k_shape=bc, layout=layout, has_h0=True, return_last_state=True,
                   **SELECTIVE_ALL)
    check(build(spec), spec, np.random.default_rng(13))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_selective_half_inputs(dtype, layout):
    """fp16/bf16 q, k, v, dt, z, h0 and outputs (float32 A, dt_bias, D and state)."""
    spec = spec_of(300, key=16, value=32, layout=layout, has_h0=True, return_last_state=True,
                   dtype=dtype, **SELECTIVE_ALL)
    check(build(spec), spec, np.random.default_rng(14))


@pytest.mark.parametrize("groups", [0, 3])
def test_selective_scan_on_its_own_bytes(groups):
    """A Mamba selective scan and its matrix-scan instance (``as_matrix``): ``selective_cpu``
    on the scan's buffers and this kernel on the same buffers reshaped both equal the
    selective oracle."""
    sel = SelectiveScanSpec(2, 6, 37, 5, groups, has_D=True, has_z=True, has_delta_bias=True,
                            delta_softplus=True, has_h0=True, return_last_state=True)
    x = selective_operands(sel, np.random.default_rng(15))
    want = selective_scan(**{k: None if v is None else v.astype(np.float64) for k, v in x.items()},
                          delta_softplus=True, return_last_state=True)
    own = tvm.compile(selective_cpu.generate(sel, **selective_cpu.default_config(sel)),
                      target="llvm").mod
    got = run(own, [x[n] for n in SELECTIVE_ORDER], [w.shape for w in want], sel.dtype)
    spec, names = sel.as_matrix(), {m: s for s, m in SELECTIVE_AS_MATRIX.items()}
    assert spec.as_selective() == sel and spec.layout == "channel_major"
    inputs = [x[names[n]].reshape(shape) for n, shape in spec.operand_shapes().items()]
    mine = run(build(spec), inputs, [spec.out_shape, spec.state_shape], spec.dtype)
    for name, a, b, w in zip(("out", "last_state"), got, mine, want):
        assert_close(a, w, sel.dtype, f"{name} (selective_cpu)")
        assert_close(b.reshape(w.shape), w, sel.dtype, f"{name} (matrix_cpu)")


def test_realize_picks_it():
    spec = spec_of(decay="key", has_h0=True, return_last_state=True)
    func = tir_schedules.realize(spec, "llvm")
    assert [p.name for p in func.params] == ["q", "k", "v", "g", "h0", "o", "last"]
    assert func.body is not None and matrix_cpu.applies(spec)
    check(tir_schedules.build(spec, "llvm"), spec, np.random.default_rng(10))
