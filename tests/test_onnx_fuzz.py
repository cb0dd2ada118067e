"""Random ONNX Scan/Loop models (``scanweaver_tvm.fuzz.onnx_models``) against ONNX Runtime: a
fixed subset must convert and match, or be refused with the near miss's reason, and the subset
must draw every family (update spellings, coefficients, outputs, near misses, Loop slices)."""
import pytest

from scanweaver_tvm.fuzz import onnx_models as om

SUBSET = range(0, 64)


def _families():
    return ([f"onnx:update:{k}" for k in om.UPDATES] + [f"onnx:coef:{k}" for k in om.COEFFICIENTS]
            + [f"onnx:out:{k}" for k in om.OUTPUTS] + [f"onnx:near:{k}" for k in om.NEAR_MISSES]
            + ["onnx:loop", "onnx:scan", "onnx:states1", "onnx:states2", "onnx:states3",
               "onnx:loop_gather", "onnx:loop_slice"])


def test_the_subset_draws_every_family_at_length_8_or_more():
    drawn = set()
    for seed in SUBSET:
        case = om.onnx_case(seed)
        if case.length >= 8:
            drawn.update(case.tags)
    assert [f for f in _families() if f not in drawn] == []


@pytest.mark.parametrize("seed", SUBSET)
def test_case_matches_onnxruntime_or_is_refused_for_its_reason(seed):
    case = om.onnx_case(seed)
    status, detail = om.check_onnx_case(case)
    assert status == ("refused" if case.refusal else "ok"), f"seed {seed} {case.tags}: {detail}"


def test_a_wrong_conversion_would_be_caught(monkeypatch):
    """The checker is not vacuous: with the scan's direction flipped on purpose, a forward case
    is reported as a mismatch."""
    from relax_pass import body
    seed = next(s for s in SUBSET if om.onnx_case(s).refusal is None and "onnx:dirs00" in om.onnx_case(s).tags
                and om.onnx_case(s).length > 2)
    real = body.lift_body
    monkeypatch.setattr(body, "lift_body", lambda *a: real(*a[:-1], not a[-1]))
    from scanweaver_tvm import onnx_loops
    monkeypatch.setattr(onnx_loops, "lift_body", body.lift_body)
    status, _ = om.check_onnx_case(om.onnx_case(seed))
    assert status == "mismatch"
