"""The max-stabilized (log-space) scan: spec, algebra, float64 oracles, Relax call, interpreter."""
import numpy as np
import pytest
import torch
import tvm
from tvm import relax

import scanweaver_tvm as sw
from relax_pass.interpret import Interpreter
from scanweaver_core import algebra, reference
from scanweaver_core.exprs import VarMap
from scanweaver_core.scan_op import emit_stabilized_scan, parse_scan, spec_from_json, spec_to_json
from scanweaver_core.spec import StabilizedScanSpec

B, L, C = 2, 9, 4


def _arrays(rng, layout="time_major", decay="channel", values=True, bonus=False, h0=False, scale=3.0):
    shape = (B, L, C) if layout == "time_major" else (B, C, L)
    k = rng.normal(size=shape) * scale
    out = {"k": k, "v": rng.normal(size=shape) if values else None,
           "w": {"none": None, "channel": -np.exp(rng.normal(size=C)),
                 "step": rng.normal(size=shape)}[decay],
           "u": rng.normal(size=C) if bonus else None}
    if h0:
        state = [rng.random((B, C)) + 0.5, rng.normal(size=(B, C)) * 2]
        out["h0"] = ([rng.normal(size=(B, C))] if values else []) + state
    return out


def _rwkv_cpu(time_decay, time_first, key, value, state=None):
    """transformers' ``rwkv_linear_attention_cpu`` (RWKV-4's WKV), here in float64."""
    from transformers.models.rwkv.modeling_rwkv import rwkv_linear_attention_cpu
    t = lambda x: torch.from_numpy(np.asarray(x, dtype=np.float64))  # noqa: E731
    out, st = rwkv_linear_attention_cpu(t(time_decay), t(time_first), t(key), t(value),
                                        None if state is None else [t(s) for s in state], True)
    return out.numpy(), [s.numpy() for s in st]


def test_spec_shapes_names_and_dtypes():
    spec = StabilizedScanSpec(2, 3, 5, "channel", True, True, True, False, True)
    assert spec.operand_names() == ["k", "v", "w", "u", "num0", "den0", "max0"]
    assert spec.output_names() == ["out", "last_num", "last_den", "last_max"]
    assert spec.operand_shapes()["w"] == (3,) and spec.seq_shape == (2, 5, 3)
    half = StabilizedScanSpec(2, 3, 5, "step", False, layout="channel_major", dtype="float16")
    assert half.operand_names() == ["k", "w"] and half.seq_shape == (2, 3, 5)
    assert half.buffer_dtypes() == {"k": "float16", "w": "float16", "out": "float16"}
    assert spec_from_json(StabilizedScanSpec, spec_to_json(spec)) == spec


@pytest.mark.parametrize("bad, match", [
    (dict(decay="linear"), "decay"), (dict(layout="rows"), "layout"), (dict(dtype="float64"), "dtype"),
    (dict(length=0), "length"), (dict(channels="C"), "channels")])
def test_spec_rejects(bad, match):
    with pytest.raises(ValueError, match=match):
        StabilizedScanSpec(**{**dict(batch=2, channels=3, length=4), **bad})


def test_for_arrays_checks_operands():
    k = np.zeros((2, 5, 3), "float32")
    with pytest.raises(ValueError, match="w: expected shape"):
        StabilizedScanSpec.for_arrays(k, k, np.zeros(5, "float32"))
    with pytest.raises(ValueError, match="v: expected shape"):
        StabilizedScanSpec.for_arrays(k, np.zeros((2, 3, 5), "float32"))
    with pytest.raises(ValueError, match="h0: expected 3 arrays"):
        StabilizedScanSpec.for_arrays(k, k, h0=[np.zeros((2, 3), "float32")] * 2)
    with pytest.raises(ValueError, match="u: dtype float16 is not float32"):
        StabilizedScanSpec.for_arrays(k, k, u=np.zeros(3, "float16"))
    assert StabilizedScanSpec.for_arrays(k, w=k).decay == "step"


def test_log_compose_is_associative_and_the_identity_is_neutral():
    rng = np.random.default_rng(1)
    elems = [(rng.normal(size=4), rng.normal(size=4) * 30, rng.normal(size=4), rng.random(4) + .1)
             for _ in range(3)]
    left = algebra.log_compose(algebra.log_compose(elems[0], elems[1]), elems[2])
    right = algebra.log_compose(elems[0], algebra.log_compose(elems[1], elems[2]))
    for a, b in zip(left, right):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    for e in elems:
        for got in (algebra.log_compose(algebra.LOG_IDENTITY, e), algebra.log_compose(e, algebra.LOG_IDENTITY)):
            for a, b in zip(got, e):
                np.testing.assert_allclose(a, b, rtol=1e-12)


def test_a_tree_of_compositions_is_the_loop():
    """The monoid as a parallel scan: a balanced tree of compositions gives the loop's state."""
    rng = np.random.default_rng(2)
    a = _arrays(rng, decay="step")
    elems = [algebra.log_step(a["w"][:, t], a["k"][:, t], a["v"][:, t]) for t in range(L)]

    def tree(xs):
        return xs[0] if len(xs) == 1 else algebra.log_compose(tree(xs[:len(xs) // 2]), tree(xs[len(xs) // 2:]))

    top = tree(elems)
    state = algebra.log_apply(top, (np.zeros((B, C)), np.zeros((B, C)), np.full((B, C), algebra.LOG_FLOOR)))
    _, last = reference.stabilized_scan(a["k"], a["v"], a["w"], return_last_state=True)
    for x, y in zip(state, last):
        np.testing.assert_allclose(x, y, rtol=1e-12)


@pytest.mark.parametrize("layout", ["time_major", "channel_major"])
@pytest.mark.parametrize("decay", ["none", "channel", "step"])
@pytest.mark.parametrize("values, bonus, h0, reverse", [
    (True, False, False, False), (True, True, False, False), (True, True, True, True),
    (False, False, False, True), (False, True, True, False), (True, False, True, False)])
def test_direct_oracle_equals_the_stabilized_loop(layout, decay, values, bonus, h0, reverse):
    a = _arrays(np.random.default_rng(3), layout, decay, values, bonus, h0)
    direct = reference.stabilized_scan(**a, reverse=reverse, return_last_state=True, layout=layout)
    loop = reference.stabilized_scan(**a, reverse=reverse, return_last_state=True, layout=layout, method="loop")
    np.testing.assert_allclose(direct[0], loop[0], rtol=1e-12, atol=1e-12)
    assert len(direct[1]) == (3 if values else 2)
    for x, y in zip(direct[1], loop[1]):
        np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-12)


def test_den_only_without_decay_is_logcumsumexp_even_at_extremes():
    k = np.random.default_rng(4).uniform(-100, 100, size=(B, L, C))
    k[0, :3, 0] = -np.inf
    want = np.logaddexp.accumulate(k, axis=1)
    for method in ("direct", "loop"):
        np.testing.assert_allclose(reference.stabilized_scan(k, method=method), want, rtol=1e-13)
    np.testing.assert_allclose(reference.stabilized_scan(k[:, ::-1], reverse=True)[:, ::-1], want, rtol=1e-13)


@pytest.mark.parametrize("state", [False, True])
def test_the_oracle_is_rwkv4s_wkv(state):
    """Against transformers' own loop (float64), k up to +-80 where exp(k) v overflows float32."""
    rng = np.random.default_rng(5)
    time_decay, time_first = rng.normal(size=C), rng.normal(size=C)
    key, value = rng.uniform(-80, 80, size=(B, L, C)), rng.normal(size=(B, L, C))
    key = key.astype(np.float32).astype(np.float64)    # HF casts the key with .float()
    h0 = [rng.normal(size=(B, C)), rng.random((B, C)) + .5, rng.normal(size=(B, C))] if state else None
    want, want_state = _rwkv_cpu(time_decay, time_first, key, value, h0)
    got, got_state = reference.stabilized_scan(key, value, -np.exp(time_decay), time_first, h0,
                                               return_last_state=True)
    np.testing.assert_allclose(got, want, rtol=1e-10)
    for x, y in zip(got_state, want_state):
        np.testing.assert_allclose(x, y, rtol=1e-10)


def test_relax_call_and_the_interpreter():
    """The scan as a Relax call (``emit_stabilized_scan``), evaluated by the interpreter."""
    rng = np.random.default_rng(6)
    a = _arrays(rng, bonus=True, h0=True)
    bb = relax.BlockBuilder()
    names = ["k", "v", "w", "u", "num0", "den0", "max0"]
    data = dict(zip(names, [a["k"], a["v"], a["w"], a["u"], *a["h0"]]))
    params = [relax.Var(n, relax.TensorType(x.shape, "float32")) for n, x in data.items()]
    with bb.function("main", params):
        with bb.dataflow():
            k, v, w, u, *h0 = params
            parts = emit_stabilized_scan(bb.emit, k, v, w, u, h0, return_last_state=True)
            out = bb.emit_output(relax.Tuple(parts))
        bb.emit_func_output(out)
    func = bb.get()["main"]
    assert "scanweaver.stabilized_scan" in func.script()
    calls = [b.value for blk in func.body.blocks for b in blk.bindings if parse_scan(b.value)]
    spec, operands = parse_scan(calls[0])
    assert spec.has_bonus and spec.has_h0 and spec.return_last_state and len(operands) == 7
    value_of = VarMap((b.var, b.value) for blk in func.body.blocks for b in blk.bindings)
    got = Interpreter(value_of, missing=lambda var: data[var.name])(func.body.body)
    want = reference.stabilized_scan(a["k"], a["v"], a["w"], a["u"], a["h0"], return_last_state=True)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    for x, y in zip(got[1:], want[1]):
        np.testing.assert_allclose(x, y, rtol=1e-12)


def test_emit_rejects_a_wrong_dtype():
    bb = relax.BlockBuilder()
    k = relax.Var("k", relax.TensorType((B, L, C), "float16"))
    w = relax.Var("w", relax.TensorType((C,), "float16"))
    with bb.function("main", [k, w]):
        with pytest.raises(ValueError, match="w: dtype float16 is not float32"):
            emit_stabilized_scan(bb.emit, k, w=w)
        bb.emit_func_output(k)


def test_exposed_like_the_other_specs():
    assert sw.StabilizedScanSpec is StabilizedScanSpec
    from scanweaver_tvm import spec as public
    assert public.StabilizedScanSpec is StabilizedScanSpec and sw.reference.stabilized_scan
    assert tvm is not None
