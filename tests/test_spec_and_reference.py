"""The spec's validation (clear ValueErrors naming the operand), the pair algebra and the oracle."""
import numpy as np
import pytest

from scanweaver_tvm import reference as ref
from scanweaver_core.algebra import IDENTITY, apply, compose
from scanweaver_core.spec import AffineScanSpec, SelectiveScanSpec


def test_compose_is_associative_with_identity():
    rng = np.random.default_rng(0)
    p, q, r = (tuple(rng.standard_normal(2)) for _ in range(3))
    left = compose(compose(p, q), r)
    right = compose(p, compose(q, r))
    assert np.allclose(left, right)
    assert np.allclose(compose(IDENTITY, p), p) and np.allclose(compose(p, IDENTITY), p)
    h = 0.7
    assert np.isclose(apply(compose(p, q), h), apply(q, apply(p, h)))


def test_reference_matches_explicit_loop():
    rng = np.random.default_rng(1)
    a, b, h0 = rng.uniform(-1, 1, 5), rng.standard_normal(5), 0.3
    h, want = h0, []
    for t in reversed(range(5)):
        h = a[t] * h + b[t]
        want.append(h)
    got = ref.affine_scan(a, b, np.array(h0), axis=0, reverse=True)
    assert np.allclose(got, want[::-1])


def test_selective_reference_is_an_affine_scan():
    """With N=1, C=1 and no extras, the selective scan is the plain scan of (exp(dA), d*B*u)."""
    rng = np.random.default_rng(2)
    u, delta = rng.standard_normal((2, 3, 9)), rng.uniform(0.01, 0.2, (2, 3, 9))
    A, B, C = -rng.uniform(0.5, 2, (3, 1)), rng.standard_normal((2, 1, 9)), np.ones((2, 1, 9))
    got = ref.selective_scan(u, delta, A, B, C)
    want = ref.affine_scan(np.exp(delta * A[None, :, :1]), delta * B * u, axis=-1)
    assert np.allclose(got, want)


@pytest.mark.parametrize("kwargs,operand", [
    (dict(shape=(3, 0)), "b"),                          # L = 0
    (dict(shape=(3, 4), a_shape=(2, 4)), "a"),          # a does not broadcast
    (dict(shape=(3, 4), axis=2), "axis"),               # axis out of range
    (dict(shape=(3, 4), dtype="int32"), "dtype"),       # integer dtype
    (dict(shape=(3, 4), dtype="complex64"), "dtype"),
    (dict(shape=(3, 4), outputs=()), "outputs"),
])
def test_plain_spec_rejects(kwargs, operand):
    with pytest.raises(ValueError, match=f"^{operand}:"):
        AffineScanSpec.create(**kwargs)


def test_for_arrays_checks_h0_and_dtypes():
    a, b = np.ones((3, 4), np.float32), np.ones((3, 4), np.float32)
    with pytest.raises(ValueError, match="^h0:"):
        AffineScanSpec.for_arrays(a, b, h0=np.ones((4,), np.float32), axis=1)
    with pytest.raises(ValueError, match="^a:"):
        AffineScanSpec.for_arrays(a.astype(np.float16), b)
    with pytest.raises(ValueError, match="^dtype:"):
        AffineScanSpec.for_arrays(np.ones((3, 4), np.int32), np.ones((3, 4), np.int32))


def test_selective_spec_rejects():
    u = np.ones((2, 3, 5), np.float32)
    A, B = np.ones((3, 4), np.float32), np.ones((2, 4, 5), np.float32)
    with pytest.raises(ValueError, match="^A:"):
        SelectiveScanSpec.for_arrays(u, u, np.ones((4, 4), np.float32), B, B)
    with pytest.raises(ValueError, match="^C:"):
        SelectiveScanSpec.for_arrays(u, u, A, B, np.ones((2, 4, 6), np.float32))
    with pytest.raises(ValueError, match="^u:"):
        SelectiveScanSpec.for_arrays(np.ones((2, 3, 0), np.float32), u, A, B, B)
    with pytest.raises(ValueError, match="^dtype:"):
        SelectiveScanSpec.for_arrays(u.astype(np.int32), u.astype(np.int32), A, B.astype(np.int32),
                                     B.astype(np.int32))
