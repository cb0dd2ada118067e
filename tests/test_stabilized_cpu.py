"""The stabilized scan's CPU kernel (tir_schedules/stabilized_cpu.py) against the float64 oracle,
directly and through LowerScans."""
import numpy as np
import pytest
import tvm
from tvm import relax

import tir_schedules
from relax_pass.lower import LowerScans
from scanweaver_core import reference
from scanweaver_core.scan_op import make_scan
from scanweaver_core.spec import StabilizedScanSpec
from tests.harness import NP_DTYPES, assert_close, run


def spec_of(length=37, batch=2, channels=20, **options):
    return StabilizedScanSpec(batch, channels, length, **options)


def operands(spec, rng, k_range=None):
    """Random inputs in the spec's dtypes: keys N(0, 3) (or uniform in ``k_range``), log-decays
    -exp(N(0,1)) per channel, N(0,1) per step (growth too), den0 > 0."""
    shapes, dtypes = spec.operand_shapes(), spec.operand_dtypes()
    out = {}
    for name, shape in shapes.items():
        if name == "k":
            x = rng.uniform(*k_range, size=shape) if k_range else rng.normal(size=shape) * 3
        elif name == "w":
            x = -np.exp(rng.normal(size=shape)) if spec.decay == "channel" else rng.normal(size=shape) * 0.5
        elif name == "den0":
            x = rng.random(shape) + 0.5
        elif name == "max0":
            x = rng.normal(size=shape) * 5
        else:
            x = rng.normal(size=shape)
        out[name] = x.astype(NP_DTYPES[dtypes[name]])
    return out


def expected(spec, ins):
    f64 = {n: x.astype(np.float64) for n, x in ins.items()}
    h0 = [f64[f"{n}0"] for n in spec.state_names()] if spec.has_h0 else None
    got = reference.stabilized_scan(f64["k"], f64.get("v"), f64.get("w"), f64.get("u"), h0, spec.reverse,
                                    True, spec.layout, method="loop")
    return [got[0], *(got[1] if spec.return_last_state else [])]


def check(kernel, spec, rng, k_range=None, tol=None):
    ins = operands(spec, rng, k_range)
    want = expected(spec, ins)
    outs = spec.output_shapes()
    dtypes = spec.buffer_dtypes()
    got = run(kernel, [ins[n] for n in spec.operand_names()], [outs["out"]], spec.dtype) if \
        not spec.return_last_state else _run_mixed(kernel, spec, ins)
    for name, g, w in zip(spec.output_names(), got, want):
        if tol is not None:
            err = float(np.abs(g - w).max()) / max(1.0, float(np.abs(w).max()))
            assert not np.isnan(g).any() and err <= tol, f"{name} of {spec}: relative error {err:.3g} > {tol}"
        else:
            assert_close(g, w, dtypes[name] if name == "out" else "float32", f"{name} of {spec}")


def _run_mixed(kernel, spec, ins):
    """Outputs of different dtypes (out in the spec's, the state float32), NaN-filled."""
    dtypes = spec.buffer_dtypes()
    outs = [tvm.runtime.tensor(np.full(s, np.nan, NP_DTYPES[dtypes[n]])) for n, s in spec.output_shapes().items()]
    kernel(*[tvm.runtime.tensor(np.ascontiguousarray(ins[n])) for n in spec.operand_names()], *outs)
    return [o.numpy().astype(np.float64) for o in outs]


def build(spec, **config):
    return tir_schedules.build(spec, "llvm", **config)["scanweaver_scan"]


@pytest.mark.parametrize("layout", ["time_major", "channel_major"])
@pytest.mark.parametrize("length", [1, 2, 3, 64, 1000, 1025])
def test_lengths_both_layouts(layout, length):
    spec = spec_of(length, layout=layout, has_bonus=True, has_h0=True, return_last_state=True)
    check(build(spec), spec, np.random.default_rng(length))


@pytest.mark.parametrize("layout", ["time_major", "channel_major"])
@pytest.mark.parametrize("decay", ["none", "channel", "step"])
@pytest.mark.parametrize("values, bonus, h0, reverse", [
    (True, False, False, False), (True, True, False, True), (True, False, True, True),
    (False, False, False, False), (False, True, True, True), (False, False, True, False)])
def test_every_option(layout, decay, values, bonus, h0, reverse):
    spec = spec_of(131, channels=19, layout=layout, decay=decay, has_values=values, has_bonus=bonus,
                   has_h0=h0, reverse=reverse, return_last_state=True)
    check(build(spec), spec, np.random.default_rng(7))


@pytest.mark.parametrize("layout", ["time_major", "channel_major"])
@pytest.mark.parametrize("values", [True, False])
@pytest.mark.parametrize("bound", [80, 100])
def test_extreme_keys(layout, values, bound):
    """k uniform in [-bound, bound] in float32; at 100, exp(k) itself overflows float32 (so
    does any unstabilized form), the stabilized state does not.  Exponent arguments of size
    ~100 carry float32 rounding of ~100 * 2**-24 (6e-6 relative in each weight), hence 1e-4."""
    spec = spec_of(1025, layout=layout, has_values=values, has_bonus=values, return_last_state=True)
    rng = np.random.default_rng(11)
    check(build(spec), spec, rng, k_range=(-bound, bound), tol=1e-4)
    if bound == 100:
        with np.errstate(over="ignore"):
            assert not np.isfinite(np.exp(rng.uniform(-bound, bound, size=1025).astype(np.float32))).all()


def test_an_empty_sum_stays_minus_infinity():
    """Keys of -inf (torch.logcumsumexp's masked entries): log(0) = -inf until a finite key comes."""
    spec = spec_of(5, batch=1, channels=3, decay="none", has_values=False)
    k = np.array([[[-np.inf, -np.inf, 1.0], [-np.inf, 2.0, 1.0], [0.0, -np.inf, -np.inf],
                   [-np.inf, -np.inf, -np.inf], [3.0, 0.0, -np.inf]]], dtype=np.float32)
    got = run(build(spec), [k], [k.shape], "float32")[0]
    with np.errstate(divide="ignore"):
        np.testing.assert_allclose(got, np.logaddexp.accumulate(k.astype(np.float64), axis=1), rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["time_major", "channel_major"])
def test_half_inputs_float32_state(dtype, layout):
    spec = spec_of(300, layout=layout, decay="step", has_bonus=True, has_h0=True, return_last_state=True,
                   dtype=dtype)
    check(build(spec), spec, np.random.default_rng(13))


@pytest.mark.parametrize("lanes", [4, 8, 16])
def test_packs_overhanging_the_channels(lanes):
    spec = spec_of(50, batch=3, channels=13, has_bonus=True, return_last_state=True, layout="channel_major")
    check(build(spec, lanes=lanes, tile=16), spec, np.random.default_rng(lanes))


def test_default_config():
    assert stabilized_config(spec_of(channels=768, batch=8)) == {"lanes": 16, "tile": 64, "group": 48}
    assert stabilized_config(spec_of(channels=768, batch=1)) == {"lanes": 16, "tile": 64, "group": 12}
    assert stabilized_config(spec_of(channels=3))["lanes"] == 4
    assert stabilized_config(spec_of(channels=16, batch=1, layout="channel_major"))["lanes"] == 4


@pytest.mark.parametrize("group", [2, 3, 7])
def test_packs_per_task(group):
    """A task walking several packs per step (time-major), the last group and pack overhanging C."""
    spec = spec_of(70, batch=3, channels=45, has_bonus=True, has_h0=True, return_last_state=True)
    check(build(spec, lanes=4, group=group), spec, np.random.default_rng(group))


def stabilized_config(spec):
    return tir_schedules.stabilized_cpu.default_config(spec)


def test_through_lower_scans():
    """A Relax function holding the scan call, lowered (``tir_schedules.realize`` picks
    stabilized_cpu) and compiled, gives the oracle's outputs."""
    spec = spec_of(33, decay="channel", has_bonus=True, has_h0=True, return_last_state=True)
    rng = np.random.default_rng(17)
    ins = operands(spec, rng)
    bb = relax.BlockBuilder()
    params = [relax.Var(n, relax.TensorType(x.shape, str(x.dtype))) for n, x in ins.items()]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(make_scan(spec, params))
        bb.emit_func_output(out)
    lowered = LowerScans("llvm")(bb.get())
    assert "scanweaver.stabilized_scan" not in lowered.script() and "call_tir" in lowered.script()
    ex = tvm.compile(lowered, target=tvm.target.Target("llvm"))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(x) for x in ins.values()])
    for g, w in zip(got, expected(spec, ins)):
        assert_close(g.numpy().astype(np.float64), w, "float32", "through LowerScans")


def test_tiny_tuning_run_feeds_compile(tmp_path):
    """The kernel's knobs are a MetaSchedule space (tir_schedules.search): a tiny tuning run
    writes records whose best ``LowerScans`` compiles, still correct."""
    import scanweaver_tvm as sw
    from tir_schedules import search

    spec = spec_of(60, batch=2, channels=40, has_bonus=True, return_last_state=True)
    db = sw.tune(spec, "llvm", trials=4, work_dir=tmp_path, seed=1, progress=False)
    records = db.get_all_tuning_records()
    assert 2 <= len(records) <= 4
    best = search.best_choice(db, spec, "llvm")
    assert best is not None and best.schedule == "stabilized_cpu"
    ins = operands(spec, np.random.default_rng(3))
    bb = relax.BlockBuilder()
    params = [relax.Var(n, relax.TensorType(x.shape, str(x.dtype))) for n, x in ins.items()]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(make_scan(spec, params))
        bb.emit_func_output(out)
    vm = relax.VirtualMachine(sw.compile(bb.get(), "llvm", database=db), tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(x) for x in ins.values()])
    for g, w in zip(got, expected(spec, ins)):
        assert_close(g.numpy().astype(np.float64), w, "float32", f"tuned {best}")


@pytest.mark.parametrize("layout", ["time_major", "channel_major"])
def test_symbolic_batch_and_length(layout):
    """One kernel for every (batch, L): L below, at and past the tile, odd."""
    import dataclasses

    spec = spec_of("L", batch="batch", channels=21, layout=layout, decay="step", has_bonus=True,
                   has_h0=True, return_last_state=True, reverse=True)
    assert spec.is_symbolic
    kernel = build(spec)
    for batch, length in ((1, 1), (3, 63), (2, 64), (1, 130)):
        check(kernel, dataclasses.replace(spec, batch=batch, length=length), np.random.default_rng(length))
