"""The suite's import cache (``import_cache``) answers only a repeat of the same import: the
same model class, config, weights and code.  A changed weight, a patched function of the
model's code or of ours, or another prompt size is a different key."""
import torch
from transformers.models.mamba import modeling_mamba

import scanweaver_tvm as sw
from import_cache import fingerprint
from relax_pass import fuse
from test_causal_lm import tiny_mamba


def _key(lm, sizes=(3, 5, 7)):
    return fingerprint(lm.model, lm.layout, 1, "llvm", sizes, 2, None)


def test_a_repeat_hits_and_any_change_misses(monkeypatch):
    first, again = sw.compile_causal_lm(tiny_mamba()), sw.compile_causal_lm(tiny_mamba())
    key = _key(first)
    assert _key(again) == key
    assert _key(first, sizes=(3, 5, 9)) != key
    with torch.no_grad():
        again.model.backbone.layers[0].mixer.D[0] += 1e-6
    assert _key(again) != key
    monkeypatch.setattr(modeling_mamba.MambaMixer, "forward", lambda *a, **k: None)
    assert _key(first) != key
    monkeypatch.undo()
    assert _key(first) == key
    monkeypatch.setattr(modeling_mamba, "causal_conv1d_fn", lambda *a, **k: None)
    assert _key(first) != key
    monkeypatch.undo()
    monkeypatch.setattr(fuse, "find", lambda *a, **k: None)
    assert _key(first) != key
