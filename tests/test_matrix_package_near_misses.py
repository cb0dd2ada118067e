"""The near misses among matrix-state layers written the way packages write them
(``matrix_package_layers``): each left with a reason, or found as another form (a delta-rule
scan, an affine scan) or repaired into a matrix scan, and still equal to PyTorch."""
import scanweaver_tvm as sw
from relax_pass.fuse import fuse

from harness import run_model
from matrix_package_harness import _assert_matrix_scans, _close, _inputs, _model, _want


# -- near misses ---------------------------------------------------------------------------------
def test_delta_rule_is_one_delta_scan_and_equal_to_pytorch():
    """The delta rule's update ``(I - beta k k^T) S + beta k v^T`` has a matrix coefficient:
    no affine or matrix scan is made of it; it is one delta-rule scan (``relax_pass/forms/delta/delta.py``),
    and it computes what PyTorch does."""
    model, args = _model("delta_rule"), _inputs("delta_rule")
    mod = sw.from_torch(model, args)
    fused, recs = fuse(mod)
    assert [(r.form, r.rejected) for r in recs if not r.rejected] == [("delta", False)], recs
    assert "scanweaver.delta_scan" in fused["main"].script()
    _close(run_model(mod, args), _want(model, args), rtol=1e-5)


def test_state_through_a_nonlinearity_is_left_with_its_reason():
    model, args = _model("normalized_state"), _inputs("normalized_state")
    mod = sw.from_torch(model, args)
    fused, recs = fuse(mod)
    assert "scanweaver" not in fused["main"].script()
    assert any(r.rejected and "not affine in h" in r.reason for r in recs), recs
    _close(run_model(mod, args), _want(model, args), rtol=1e-5)


def test_rwkv_readout_before_the_update_stays_an_affine_scan_with_its_reason():
    """``o_t = q_t (S_(t-1) + u k_t v_t^T)`` is not the spec's ``q_t^T S_t``: the chain is an
    affine scan (correct, with its (B, H, L, K, V) input), and ``matrix_miss`` says why."""
    model, args = _model("rwkv6_naive"), _inputs("rwkv6_naive")
    mod = sw.from_torch(model, args)
    fused, recs = fuse(mod)
    (rec,) = [r for r in recs if not r.rejected]
    assert rec.form == "affine" and "before each step's update" in rec.matrix_miss
    assert "scanweaver.matrix_scan" not in fused["main"].script()
    _close(run_model(mod, args), _want(model, args), rtol=1e-4)


def test_decay_over_both_dims_stays_an_affine_scan_with_its_reason():
    model, args = _model("gla_key_and_value_gates"), _inputs("gla_key_and_value_gates")
    mod = sw.from_torch(model, args)
    fused, recs = fuse(mod)
    (rec,) = [r for r in recs if not r.rejected]
    assert rec.form == "affine" and "varies over both state dims" in rec.matrix_miss
    _close(run_model(mod, args), _want(model, args), rtol=1e-4)


def test_integer_power_decay_is_a_matrix_scan_equal_to_pytorch():
    """The gamma ``1 - 2 ** (-5 - torch.arange(H))`` in integers (all ones in PyTorch), which
    TVM cannot build as an int64 power: ``torch_repairs`` computes it in float64, and the
    layer is an ordinary matrix scan."""
    model, args = _model("retention_integer_gamma"), _inputs("retention_integer_gamma")
    mod = sw.from_torch(model, args)
    fused, recs = fuse(mod)
    _assert_matrix_scans(fused, recs)
    _close(run_model(mod, args), _want(model, args), rtol=1e-4)
