"""The delta-rule family as one scan (``DeltaScanSpec``): the float64 oracle against the forms
fla-core and transformers ship, and the CPU kernel against the oracle.

``S_t = (I - beta_t k_t p_t^T) D_t S_{t-1} + beta_t k_t v_t^T``, ``o_t = scale S_t^T q_t``:
DeltaNet (D = I), Gated DeltaNet (a scalar decay per head), KDA (a decay per key), Comba (its
own read vector p).  The oracle's loop is checked against its associative form (the scan's
operator on (transition, input) matrix pairs) and against the packages' own kernels run in
float64."""
import inspect
import warnings

import numpy as np
import pytest
import torch

import tir_schedules
from scanweaver_core import reference
from scanweaver_core.spec import DeltaScanSpec
from tests.harness import NP_DTYPES, TOL, run

with warnings.catch_warnings():
    warnings.simplefilter("ignore")       # "Triton is not supported on current platform"
    pytest.importorskip("fla.ops")
    from fla.ops.comba.naive import naive_recurrent_comba
    from fla.ops.delta_rule.naive import delta_rule_recurrence
    from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule
    from fla.ops.kda.naive import naive_recurrent_kda
from transformers.models.qwen3_next import modeling_qwen3_next

# transformers' own torch loop (with fla installed, the name dispatches to fla's Triton kernel)
torch_recurrent_gated_delta_rule = inspect.unwrap(modeling_qwen3_next.torch_recurrent_gated_delta_rule)


def operands(spec, rng, length=None, batch=None):
    """Random operands: q, k, p, v ~ N(0, 1) (k and p normalized unless the kernel does it,
    as the models feed them: an unnormalized key makes the transition expand), beta in (0, 1),
    log-decays in (-1, 0)."""
    b, h, hk, key, value = spec.batch if batch is None else batch, spec.heads, spec.qk_heads, spec.key, spec.value
    length = spec.length if length is None else length
    x = {"q": rng.standard_normal((b, hk, length, key)), "k": rng.standard_normal((b, hk, length, key)),
         "p": rng.standard_normal((b, hk, length, key)), "v": rng.standard_normal((b, h, length, value)),
         "beta": rng.uniform(0.05, 1.0, (b, h, length))}
    if not spec.l2norm:
        for n in ("k", "p"):
            x[n] /= np.linalg.norm(x[n], axis=-1, keepdims=True)
    if spec.decay != "none":
        x["g"] = -rng.uniform(0.0, 1.0, (b, h, length) + ((key,) if spec.decay == "key" else ()))
    x = {n: a.astype(NP_DTYPES[spec.dtype]) for n, a in x.items()}
    if spec.has_h0:
        x["S0"] = rng.standard_normal((b, h, key, value)).astype(np.float32)
    return x


def expected(spec, x, method="loop"):
    f64 = {n: a.astype(np.float64) for n, a in x.items()}
    return reference.delta_scan(f64["q"], f64["k"], f64["v"], f64["beta"], f64.get("g"),
                                f64["p"] if spec.separate_read else None, f64.get("S0"), spec.scale,
                                spec.l2norm, spec.reverse, True, method=method)


# -- the oracle ---------------------------------------------------------------------------------

@pytest.mark.parametrize("decay", ["none", "head", "key"])
@pytest.mark.parametrize("separate_read,reverse,groups", [(False, False, 1), (True, True, 2), (False, True, 3)])
def test_oracle_loop_equals_the_scan_of_matrix_pairs(decay, separate_read, reverse, groups):
    spec = DeltaScanSpec(2, 6, 13, 4, 5, decay, 6 // groups, 0.5, True, separate_read, reverse, True, True)
    x = operands(spec, np.random.default_rng(0))
    (a, sa), (b, sb) = expected(spec, x), expected(spec, x, method="scan")
    np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(sa, sb, rtol=1e-10, atol=1e-12)


def _t(a):
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))


def _bthd(a):
    return _t(a).transpose(1, 2)


def test_oracle_equals_fla_delta_rule():
    """(fla's loop casts to float32: equal to float32 rounding.)"""
    spec = DeltaScanSpec(2, 3, 9, 4, 5, has_h0=True, scale=4 ** -0.5)
    x = operands(spec, np.random.default_rng(1))
    o, s = delta_rule_recurrence(_t(x["q"]), _t(x["k"]), _t(x["v"]), _t(x["beta"]), _t(x["S0"]))
    want, wants = expected(spec, x)
    np.testing.assert_allclose(o.numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s.numpy(), wants, rtol=1e-5, atol=1e-6)


def test_oracle_equals_fla_gated_delta_rule_and_comba():
    """(fla's loops cast to float32: equal to float32 rounding.)"""
    rng = np.random.default_rng(2)
    for separate in (False, True):
        spec = DeltaScanSpec(2, 3, 9, 4, 5, "head", scale=0.3, separate_read=separate, has_h0=True)
        x = operands(spec, rng)
        args = [_bthd(x[n]) for n in ("q", "k", "v")]
        if separate:
            o, s = naive_recurrent_comba(*args, _bthd(x["p"]), _bthd(x["beta"]), _bthd(x["g"]), scale=0.3,
                                         initial_state=_t(x["S0"]), output_final_state=True)
        else:
            o, s = naive_recurrent_gated_delta_rule(*args, _bthd(x["beta"]), _bthd(x["g"]), scale=0.3,
                                                    initial_state=_t(x["S0"]), output_final_state=True)
        want, wants = expected(spec, x)
        np.testing.assert_allclose(o.transpose(1, 2).numpy(), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(s.numpy(), wants, rtol=1e-5, atol=1e-6)


def test_oracle_equals_fla_kda_with_grouped_heads():
    """(fla's KDA loop casts to float32: equal to float32 rounding.)"""
    spec = DeltaScanSpec(1, 4, 7, 4, 3, "key", qk_heads=2, scale=0.5, has_h0=True)
    x = operands(spec, np.random.default_rng(3))
    o, s = naive_recurrent_kda(_bthd(x["q"]), _bthd(x["k"]), _bthd(x["v"]), _bthd(x["g"]), _bthd(x["beta"]),
                               scale=0.5, initial_state=_t(x["S0"]), output_final_state=True)
    want, wants = expected(spec, x)
    np.testing.assert_allclose(o.transpose(1, 2).numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s.numpy(), wants, rtol=1e-5, atol=1e-6)


def test_oracle_equals_transformers_qwen3_next_recurrent_kernel():
    """Qwen3-Next's decode path: grouped value heads, q and k L2-normalized in the kernel,
    q scaled by K^-1/2 (float32 inside: equal to its rounding)."""
    spec = DeltaScanSpec(2, 4, 8, 6, 5, "head", qk_heads=2, scale=6 ** -0.5, l2norm=True, has_h0=True)
    x = operands(spec, np.random.default_rng(4))
    o, s = torch_recurrent_gated_delta_rule(_bthd(x["q"]), _bthd(x["k"]), _bthd(x["v"]), _bthd(x["g"]),
                                            _bthd(x["beta"]), initial_state=_t(x["S0"]),
                                            output_final_state=True, use_qk_l2norm_in_kernel=True)
    want, wants = expected(spec, x)
    np.testing.assert_allclose(o.transpose(1, 2).numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s.numpy(), wants, rtol=1e-5, atol=1e-6)


def test_bad_specs_are_named():
    with pytest.raises(ValueError, match="decay"):
        DeltaScanSpec(1, 2, 4, 2, 2, "value")
    with pytest.raises(ValueError, match="qk_heads"):
        DeltaScanSpec(1, 4, 4, 2, 2, qk_heads=3)
    with pytest.raises(ValueError, match="heads"):
        DeltaScanSpec(1, "H", 4, 2, 2)
    q = np.zeros((1, 2, 3, 4), np.float32)
    with pytest.raises(ValueError, match="^beta: expected shape"):
        DeltaScanSpec.for_arrays(q, q, np.zeros((1, 2, 3, 5), np.float32), np.zeros((1, 2, 4), np.float32))
    with pytest.raises(ValueError, match="^g: expected"):
        DeltaScanSpec.for_arrays(q, q, np.zeros((1, 2, 3, 5), np.float32), np.zeros((1, 2, 3), np.float32),
                                 g=np.zeros((1, 2), np.float32))


# -- the CPU kernel -----------------------------------------------------------------------------

def check(spec, rng, length=None, batch=None, **config):
    """Our CPU kernel for ``spec`` (``config`` overriding its defaults), checked."""
    check_kernel(tir_schedules.build(spec, "llvm", **config)["scanweaver_scan"], spec, rng, length, batch)


def check_kernel(kernel, spec, rng, length=None, batch=None, make=None, oracle=None):
    """``kernel`` on fresh operands (outputs poisoned with NaN) against the float64 oracle;
    ``length`` and ``batch`` for a symbolic spec; ``make`` and ``oracle`` replace this file's
    ``operands`` and ``expected`` (the DPLR rule's)."""
    x = (make or operands)(spec, rng, length, batch)
    want, wants = (oracle or expected)(spec, x)
    sizes = {spec.length: spec.length if length is None else length, spec.batch: spec.batch if batch is None else batch}
    shapes = [tuple(sizes.get(d, d) for d in s) for s in spec.output_shapes().values()]
    dtypes = spec.buffer_dtypes()
    import tvm  # pylint: disable=import-outside-toplevel
    outs = [np.full(s, np.nan, dtype=NP_DTYPES[dtypes[n]]) for n, s in zip(spec.output_names(), shapes)]
    tensors = [tvm.runtime.tensor(o) for o in outs]
    kernel(*[tvm.runtime.tensor(np.ascontiguousarray(x[n])) for n in spec.operand_names()], *tensors)
    got = [t.numpy().astype(np.float64) for t in tensors]
    for name, g, w in zip(spec.output_names(), got, [want, wants]):
        assert not np.isnan(g).any(), f"{name}: {int(np.isnan(g).sum())} elements never written"
        err = float(np.abs(g - w).max()) / max(1.0, float(np.abs(w).max()))
        tol = 5 * TOL[spec.dtype] if name == "o" else 5 * TOL["float32"]
        assert err <= tol, f"{name} of {spec}: relative error {err:.3g} > {tol}"


@pytest.mark.parametrize("decay", ["none", "head", "key"])
@pytest.mark.parametrize("length", [1, 2, 3, 37])
def test_cpu_kernel_equals_oracle(decay, length):
    spec = DeltaScanSpec(2, 3, length, 8, 20, decay, scale=0.4, has_h0=length != 2, return_last_state=True)
    check(spec, np.random.default_rng(length))


@pytest.mark.parametrize("options", [
    dict(l2norm=True, qk_heads=2), dict(separate_read=True, decay="head"), dict(reverse=True, decay="key"),
    dict(l2norm=True, separate_read=True, qk_heads=1, decay="key", has_h0=True)])
def test_cpu_kernel_options(options):
    fields = dict(decay="none", scale=0.5, has_h0=False, return_last_state=True)
    fields.update(options)
    spec = DeltaScanSpec(2, 4, 11, 16, 16, **fields)
    check(spec, np.random.default_rng(5))


@pytest.mark.parametrize("lanes", [1, 4, 16])
def test_cpu_kernel_tiles_and_ragged_columns(lanes):
    spec = DeltaScanSpec(1, 2, 9, 5, 7, "head", has_h0=True, return_last_state=True)
    check(spec, np.random.default_rng(6), lanes=lanes)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cpu_kernel_half_inputs_float32_state(dtype):
    spec = DeltaScanSpec(1, 2, 65, 16, 16, "head", qk_heads=1, scale=0.25, l2norm=True, has_h0=True,
                         return_last_state=True, dtype=dtype)
    check(spec, np.random.default_rng(7))


def test_cpu_kernel_symbolic_batch_and_length():
    spec = DeltaScanSpec("B", 2, "L", 16, 16, "key", has_h0=True, return_last_state=True)
    rng = np.random.default_rng(8)
    for batch, length in ((1, 1), (2, 1025)):
        check(spec, rng, length=length, batch=batch)
