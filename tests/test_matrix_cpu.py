"""Matrix-state scan, CPU kernel (llvm) against the float64 reference on fresh random operands
with NaN-poisoned outputs: odd lengths, both directions, h0 and the last state, every decay,
broadcast operands, fp16/bf16 inputs, symbolic batch and L, and decays that force the direct
recurrence (the rescaled form's fallback)."""
import numpy as np
import pytest
import tvm

from harness import NP_DTYPES, assert_close, run
import tir_schedules
from scanweaver_core.reference import matrix_scan
from scanweaver_core.spec import DECAYS, MatrixScanSpec
from tir_schedules import matrix_cpu


def spec_of(length=37, batch=2, heads=3, key=5, value=7, **options):
    return MatrixScanSpec.create(batch, heads, length, key, value, **options)


def build(spec, **config):
    func = matrix_cpu.generate(spec, **{**matrix_cpu.default_config(spec), **config})
    assert func.attrs["global_symbol"] == "scanweaver_scan" and func.attrs["tirx.noalias"]
    return tvm.compile(func, target=tir_schedules.resolve_target("llvm")).mod


def operands(spec, rng, batch=None, length=None, g_range=(0.6, 1.0)):
    """Random operands in the input dtype at the spec's shapes (``batch``/``length`` fill in
    symbolic extents); k is scaled so the state stays O(1..10) over a thousand steps."""
    sizes = {spec.batch: batch, spec.length: length}

    def shape(s):
        return tuple(sizes.get(d) or d if isinstance(d, str) else d for d in s)

    x = {"q": rng.standard_normal(shape(spec.q_shape)),
         "k": rng.standard_normal(shape(spec.k_shape)) * 0.3,
         "v": rng.standard_normal(shape(spec.v_shape))}
    if spec.decay != "none":
        x["g"] = rng.uniform(*g_range, shape(spec.g_shape))
    if spec.has_h0:
        x["h0"] = rng.standard_normal(shape(spec.state_shape))
    return {k: v.astype(NP_DTYPES[spec.dtype]) for k, v in x.items()}


def check(kernel, spec, rng, batch=None, length=None, **kw):
    """Run the kernel; compare o (and last) with the reference on the same rounded inputs."""
    x = operands(spec, rng, batch, length, **kw)
    f64 = {k: v.astype(np.float64) for k, v in x.items()}
    want = matrix_scan(f64["q"], f64["k"], f64["v"], f64.get("g"), spec.decay, f64.get("h0"),
                       spec.reverse, spec.return_last_state)
    want = want if spec.return_last_state else (want,)
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


@pytest.mark.parametrize("decay,config", [
    ("key", dict(vtile=16, lanes=8, rows=3, parts=2, tile=7, chunk=3)),  # V tiles overhang V,
    ("value", dict(vtile=16, lanes=8, rows=3, parts=2, tile=7, chunk=3)),  # K % rows != 0
    ("scalar", dict(vtile=8, lanes=8, rows=8, parts=4, tile=5, chunk=5, prefetch=0)),
    ("value", dict(chunk=0)),                                        # only the direct recurrence
])
def test_configs(decay, config):
    spec = spec_of(61, key=10, value=21, decay=decay, reverse=True, has_h0=True,
                   return_last_state=True)
    check(build(spec, **config), spec, np.random.default_rng(3))


def test_split_value_tiles():
    """One (batch, head): the default splits V across tasks to use both cores."""
    spec = spec_of(300, batch=1, heads=1, key=16, value=64, decay="value", return_last_state=True)
    assert matrix_cpu.default_config(spec)["vtile"] < 64
    check(build(spec), spec, np.random.default_rng(4))


@pytest.mark.parametrize("decay", ["scalar", "key"])
def test_fallback_decays(decay):
    """Decays whose running product leaves the rescaled form's range (zeros, a strong decay, a
    growing one): those tiles run the direct recurrence; the others stay rescaled (negative
    decays included)."""
    spec = spec_of(200, key=8, value=16, decay=decay, has_h0=True, return_last_state=True)
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


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("decay", ["none", "key"])
def test_half_inputs(dtype, decay):
    """fp16/bf16 operands and outputs, float32 state: within the output dtype's rounding (the
    key decay also through the direct recurrence, which converts the operands where they lie)."""
    spec = spec_of(300, key=16, value=32, decay=decay, has_h0=True, return_last_state=True,
                   dtype=dtype)
    kernel, rng = build(spec), np.random.default_rng(8)
    check(kernel, spec, rng)
    if decay == "key":
        check(kernel, spec, rng, g_range=(0.0, 0.05))


@pytest.mark.parametrize("decay,reverse", [("key", True), ("value", False)])
def test_symbolic_batch_and_length(decay, reverse):
    """One kernel for every (batch, L), L below, at and past the tile, odd."""
    spec = spec_of("L", batch="batch", key=6, value=20, decay=decay, reverse=reverse,
                   has_h0=True, return_last_state=True,
                   g_shape=("batch", 3, 1, 20) if decay == "value" else None)
    kernel, rng = build(spec), np.random.default_rng(9)
    for batch, length in [(1, 1), (2, 31), (3, 32), (1, 33), (2, 517)]:
        check(kernel, spec, rng, batch=batch, length=length)


def test_realize_picks_it():
    spec = spec_of(decay="key", has_h0=True, return_last_state=True)
    func = tir_schedules.realize(spec, "llvm")
    assert [p.name for p in func.params] == ["q", "k", "v", "g", "h0", "o", "last"]
    assert func.body is not None and matrix_cpu.applies(spec)
    check(tir_schedules.build(spec, "llvm"), spec, np.random.default_rng(10))
