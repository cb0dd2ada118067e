"""The diagonal-plus-rank-1 rule as one scan (``DeltaScanSpec(rule="dplr")``): RWKV-7's and
fla's generalized delta rule, ``S_t = D_t S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T``,
``o_t = scale S_t^T q_t``.  The float64 oracle against its associative form and against
fla-core's DPLR / IPLR loops and chunkwise forms; the CPU kernel against the oracle."""
import warnings

import numpy as np
import pytest
import torch

import tir_schedules
from scanweaver_core import reference
from scanweaver_core.spec import DeltaScanSpec
from tests.harness import NP_DTYPES
from tests.test_delta_rule import check_kernel as delta_check_kernel

with warnings.catch_warnings():
    warnings.simplefilter("ignore")       # "Triton is not supported on current platform"
    pytest.importorskip("fla.ops")
    from fla.ops.generalized_delta_rule.dplr.naive import dplr_chunkwise, dplr_recurrence
    from fla.ops.generalized_delta_rule.iplr.naive import iplr_chunkwise, iplr_recurrence


def operands(spec, rng, length=None, batch=None):
    """RWKV-7's shapes of the rank-1 term: ``a = -kk``, ``b = kk * gate`` (kk a unit key,
    gate in (0, 1)), so ``D + b a^T`` contracts; q, k, v ~ N(0, 1) (k scaled down), log-decays
    in (-1, 0)."""
    b, h, hk, key, value = spec.batch if batch is None else batch, spec.heads, spec.qk_heads, spec.key, spec.value
    length = spec.length if length is None else length
    kk = rng.standard_normal((b, hk, length, key))
    kk /= np.linalg.norm(kk, axis=-1, keepdims=True)
    x = {"q": rng.standard_normal((b, hk, length, key)), "k": 0.3 * rng.standard_normal((b, hk, length, key)),
         "v": rng.standard_normal((b, h, length, value)), "a": -kk, "b": kk * rng.uniform(0, 1, kk.shape)}
    if spec.decay != "none":
        x["g"] = -rng.uniform(0.0, 1.0, (b, h, length) + ((key,) if spec.decay == "key" else ()))
    x = {n: arr.astype(NP_DTYPES[spec.dtype]) for n, arr in x.items()}
    if spec.has_h0:
        x["S0"] = rng.standard_normal((b, h, key, value)).astype(np.float32)
    return x


def expected(spec, x, method="loop"):
    f64 = {n: arr.astype(np.float64) for n, arr in x.items()}
    return reference.dplr_scan(*(f64[n] for n in "qkvab"), f64.get("g"), f64.get("S0"), spec.scale,
                               spec.reverse, True, method=method)


def _t(arr):
    return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32))


# -- the oracle ---------------------------------------------------------------------------------

@pytest.mark.parametrize("decay", ["none", "head", "key"])
@pytest.mark.parametrize("reverse,groups", [(False, 1), (True, 2)])
def test_oracle_loop_equals_the_scan_of_matrix_pairs(decay, reverse, groups):
    spec = DeltaScanSpec(2, 4, 13, 4, 5, decay, 4 // groups, 0.5, reverse=reverse, has_h0=True,
                         return_last_state=True, rule="dplr")
    x = operands(spec, np.random.default_rng(0))
    (o1, s1), (o2, s2) = expected(spec, x), expected(spec, x, method="scan")
    np.testing.assert_allclose(o1, o2, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(s1, s2, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("decayed", [True, False])
def test_oracle_equals_fla_dplr_and_iplr_loops_and_chunkwise_forms(decayed):
    """fla's loops and chunkwise forms in float32 (they mix dtypes in float64: q, k, v, beta
    and gk are cast to float32, alpha is not), q scaled by K^-1/2 inside: equal to float32
    rounding.  ``alpha`` is our ``a``, ``beta`` our ``b``."""
    spec = DeltaScanSpec(1, 2, 64, 8, 6, "key" if decayed else "none", scale=8 ** -0.5, has_h0=True,
                         return_last_state=True, rule="dplr")
    x = operands(spec, np.random.default_rng(1))
    want, wants = expected(spec, x)
    args = [_t(x[n]) for n in "qkvab"]
    if decayed:
        runs = [dplr_recurrence(*args, _t(x["g"]), initial_state=_t(x["S0"])),
                dplr_chunkwise(*args, _t(x["g"]), initial_state=_t(x["S0"]), chunk_size=16)]
    else:
        runs = [iplr_recurrence(*args, initial_state=_t(x["S0"])),
                iplr_chunkwise(*args, initial_state=_t(x["S0"]), chunk_size=16)]
    for o, s in runs:
        np.testing.assert_allclose(o.double().numpy(), want, rtol=2e-4, atol=2e-5)
        np.testing.assert_allclose(s.double().numpy(), wants, rtol=2e-4, atol=2e-5)


def test_bad_dplr_specs_are_named():
    with pytest.raises(ValueError, match="rule"):
        DeltaScanSpec(1, 2, 4, 2, 2, rule="rank2")
    with pytest.raises(ValueError, match="dplr"):
        DeltaScanSpec(1, 2, 4, 2, 2, l2norm=True, rule="dplr")
    q = np.zeros((1, 2, 3, 4), np.float32)
    with pytest.raises(ValueError, match="beta .* or both a and b"):
        DeltaScanSpec.for_arrays(q, q, q, np.zeros((1, 2, 3), np.float32), a=q, b=q)
    with pytest.raises(ValueError, match="^b: expected shape"):
        DeltaScanSpec.for_arrays(q, q, q, None, a=q, b=np.zeros((1, 2, 3, 5), np.float32))


# -- the CPU kernel -----------------------------------------------------------------------------

def check(spec, rng, length=None, batch=None, **config):
    """Our CPU kernel for ``spec`` (``config`` overriding its defaults), checked."""
    check_kernel(tir_schedules.build(spec, "llvm", **config)["scanweaver_scan"], spec, rng, length, batch)


def check_kernel(kernel, spec, rng, length=None, batch=None):
    """``kernel`` against the DPLR oracle (``test_delta_rule.check_kernel``'s checks)."""
    delta_check_kernel(kernel, spec, rng, length, batch, make=operands, oracle=expected)


@pytest.mark.parametrize("decay", ["none", "head", "key"])
@pytest.mark.parametrize("length", [1, 2, 3, 37])
def test_cpu_kernel_equals_oracle(decay, length):
    spec = DeltaScanSpec(2, 3, length, 8, 20, decay, scale=0.4, has_h0=length != 2, return_last_state=True,
                         rule="dplr")
    check(spec, np.random.default_rng(length))


@pytest.mark.parametrize("options", [dict(reverse=True, decay="key"), dict(qk_heads=2, decay="head"),
                                     dict(dtype="float16", decay="key"), dict(dtype="bfloat16")])
def test_cpu_kernel_options(options):
    fields = dict(decay="none", scale=0.5, has_h0=True, return_last_state=True, rule="dplr")
    fields.update(options)
    check(DeltaScanSpec(2, 4, 11, 16, 16, **fields), np.random.default_rng(5))


@pytest.mark.parametrize("lanes", [1, 16])
def test_cpu_kernel_tiles_and_ragged_columns(lanes):
    spec = DeltaScanSpec(1, 2, 9, 5, 7, "key", has_h0=True, return_last_state=True, rule="dplr")
    check(spec, np.random.default_rng(6), lanes=lanes)


def test_cpu_kernel_symbolic_batch_and_length():
    spec = DeltaScanSpec("B", 2, "L", 16, 16, "key", has_h0=True, return_last_state=True, rule="dplr")
    rng = np.random.default_rng(8)
    for batch, length in ((1, 1), (2, 1025)):
        check(spec, rng, length=length, batch=batch)
