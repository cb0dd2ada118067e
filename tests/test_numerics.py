"""Float32 error of the scan realizations stays within 4x the sequential fp32 loop's (|a| <= 1).

The same measurement as ``python -m bench.numerics`` (max over lanes and median over lanes of
the per-lane error relative to the float64 reference), on fresh random inputs, for the CPU
realization and the emulated Blelloch GPU kernel (the tree order, the likeliest to drift).
"""
import numpy as np
import pytest

from bench import numerics as nm
from scanweaver_tvm import reference

LANES = 32
LENGTHS = [1000, 4097, 16384]
CASES = ["a~U(0.5,1)", "a~U(-1,1)", "a~U(0.99,1)"]


@pytest.fixture(scope="module", params=["cpu", "blelloch"])
def realization(request):
    return request.param, nm.build_plain(request.param, LANES)


def test_bounded_error_within_4x_of_the_sequential_loop(realization):
    name, run = realization
    seed = int(np.random.SeedSequence().entropy % 2**32)
    rng = np.random.default_rng(seed)
    for case in CASES:
        for length in LENGTHS:
            a, b = nm.plain_case(case, rng, LANES, length)
            want = reference.affine_scan(a.astype(np.float64), b.astype(np.float64), axis=1)
            row = nm.summarize(nm.lane_errors(run(a, b), want),
                               nm.lane_errors(nm.sequential_fp32(a, b), want))
            where = f"{name}, {case}, L={length}, seed {seed}: {row}"
            assert row["ratio_max"] <= nm.TARGET_RATIO and row["ratio_med"] <= nm.TARGET_RATIO, where
            assert row["err_max"] < 2e-6, where          # float32-sized, not merely "like the loop"


def test_the_bound_rejects_a_less_accurate_result():
    """The 4x bound is tight enough to fail a result rounded to float16 (~40x worse), and a
    result that misses one step."""
    rng = np.random.default_rng(0)
    a, b = nm.plain_case("a~U(0.5,1)", rng, LANES, 1000)
    want = reference.affine_scan(a.astype(np.float64), b.astype(np.float64), axis=1)
    seq = nm.lane_errors(nm.sequential_fp32(a, b), want)
    fp16 = nm.summarize(nm.lane_errors(want.astype(np.float16), want), seq)
    assert fp16["ratio_max"] > nm.TARGET_RATIO and fp16["ratio_med"] > nm.TARGET_RATIO
    b_skipped = b.copy()
    b_skipped[:, 500] = 0
    skipped = nm.sequential_fp32(a, b_skipped)
    assert nm.summarize(nm.lane_errors(skipped, want), seq)["ratio_med"] > 1e3


def test_unwritten_output_is_an_error():
    want = np.ones((2, 5))
    got = want.copy()
    got[1, 3] = np.nan
    with pytest.raises(AssertionError, match="never written"):
        nm.lane_errors(got, want)
