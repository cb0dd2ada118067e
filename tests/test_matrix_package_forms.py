"""Matrix-state layers written the way their home packages write them (``matrix_package_layers``:
fla's naive recurrent references, fast-transformers' recurrent linear attention, HF's Mamba-2
cache path, mamba_ssm's per-step SSD), each found as matrix scans, leaving no tensor of the
state sequence's size, equal to PyTorch (and, exported to ONNX, to ONNX Runtime).  The near
misses are in ``test_matrix_package_near_misses.py``."""
import pytest
import torch

import scanweaver_tvm as sw
from relax_pass.fuse import fuse

from harness import run_model, torch_outputs
from matrix_package_harness import _assert_matrix_scans, _close, _export, _inputs, _matrix, _model, _want
from test_matrix_forms import _run


# -- the forms -----------------------------------------------------------------------------------
FORMS = [("gla_naive", 1), ("simple_gla_naive", 1), ("retention_recurrent", 1), ("linear_attention_naive", 1),
         ("linear_attention_recurrent", 1), ("linear_attention_bmm", 1), ("hgrn2_naive", 1), ("ssd_recurrent", 1),
         ("ssd_recurrent_groups", 1), ("mamba2_cache_steps", 1), ("ssd_state_update_steps", 1),
         ("gla_decay_in_two_statements", 1), ("gsa_two_passes", 2), ("two_gla_layers", 2)]


@pytest.mark.parametrize("name,count", FORMS, ids=[n for n, _ in FORMS])
def test_package_form_is_a_matrix_scan_equal_to_pytorch(name, count):
    model, args = _model(name), _inputs(name)
    mod = sw.from_torch(model, args)
    fused, recs = fuse(mod)
    _assert_matrix_scans(fused, recs, count)
    _close(run_model(mod, args), _want(model, args), rtol=1e-4)


@pytest.mark.parametrize("name,dtype,batch,length", [
    ("gla_naive", torch.bfloat16, 1, 7), ("gla_naive", torch.float16, 3, 2),
    ("simple_gla_naive", torch.bfloat16, 3, 7), ("hgrn2_naive", torch.float16, 1, 7),
    ("ssd_recurrent", torch.float32, 3, 2), ("mamba2_cache_steps", torch.float32, 1, 7)])
def test_half_inputs_batches_and_short_lengths(name, dtype, batch, length):
    """bf16/fp16 activations with a ``.float()`` state (the scan runs in float32, the output is
    PyTorch's to its rounding), batch 1 and 3, L = 2 (a first step and one more)."""
    model, args = _model(name), _inputs(name, batch, length, dtype)
    mod = sw.from_torch(model, args)
    fused, recs = fuse(mod)
    _assert_matrix_scans(fused, recs)
    assert [r.dtype for r in _matrix(recs)] == ["float32"]
    _close(_run(mod, args), _want(model, args), rtol=1e-4 if dtype == torch.float32 else 2e-2)


def test_one_step_is_left_as_it_is_and_equal_to_pytorch():
    """L = 1: a single step is no recurrence; nothing is rewritten."""
    model, args = _model("gla_naive"), _inputs("gla_naive", 1, 1)
    mod = sw.from_torch(model, args)
    fused, recs = fuse(mod)
    assert not _matrix(recs) and "scanweaver" not in fused["main"].script()
    _close(run_model(mod, args), _want(model, args), rtol=1e-5)


# -- ONNX ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gla_naive", "ssd_recurrent", "linear_attention_recurrent"])
def test_onnx_export_is_a_matrix_scan_equal_to_onnxruntime_and_pytorch(name):
    """ONNX spells the in-place writes as ScatterND, keeps einsums one op (three operands for
    the normalized readout) and returns the stacked readouts themselves."""
    import onnxruntime as ort

    model, args = _model(name), _inputs(name)
    proto = _export(model, args)
    feeds = {i.name: a.numpy() for i, a in zip(proto.graph.input, args)}
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    mod = sw.from_onnx(proto)
    fused, recs = fuse(mod)
    _assert_matrix_scans(fused, recs)
    got = run_model(mod, args)
    _close(got, session.run(None, feeds), rtol=1e-5)
    _close(got, torch_outputs(model, args), rtol=1e-5)
