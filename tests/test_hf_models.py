"""Hugging Face ``transformers`` models as users have them (tiny random configs, no weights):
imported with ``sw.from_torch(model, (input_ids,))`` and nothing else, their recurrences found
in the selective form, compiled for the CPU and compared with PyTorch."""
import re

import numpy as np
import pytest
import torch
import tvm
from tvm import relax

import scanweaver_tvm as sw
from scanweaver_tvm import torch_repairs

from harness import assert_outputs_match, run_model

transformers = pytest.importorskip("transformers")   # pinned in pyproject's dev extra


def hf_mamba(layers=1, dtype=torch.float32, seed=0, **config):
    torch.manual_seed(seed)
    cfg = transformers.MambaConfig(**{**dict(vocab_size=64, hidden_size=32, state_size=8,
                                              num_hidden_layers=layers, expand=2, conv_kernel=4),
                                      **config})
    return transformers.MambaForCausalLM(cfg).eval().to(dtype)


def logits(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=False).logits.float().numpy()


def tensor_shapes(mod):
    """Every static tensor shape in ``mod``: its Relax expressions' and its TIR buffers'."""
    shapes = []
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, lambda e: shapes.append(
                getattr(getattr(e, "ty", None), "shape", None)))
        else:
            shapes.extend(m.split(",") for m in re.findall(r"T\.Buffer\(\(([^()]*)\)", func.script()))
    out = []
    for s in shapes:
        try:
            out.append(tuple(int(str(v).replace("T.int64", "").strip("() ")) for v in s if str(v).strip()))
        except (TypeError, ValueError):
            pass
    return out


@pytest.mark.parametrize("layers,batch,length", [(1, 1, 2), (1, 2, 7), (2, 1, 16), (2, 2, 64)])
def test_mamba_is_one_selective_scan_per_layer_and_matches_pytorch(layers, batch, length):
    model = hf_mamba(layers)
    ids = torch.randint(0, 64, (batch, length), generator=torch.Generator().manual_seed(length))
    mod = sw.from_torch(model, (ids,))
    found = sw.find_recurrences(mod, include_rejected=True)
    assert [(r.form, r.rejected, r.length) for r in found] == [("selective", False, length)] * layers, found
    lowered = sw.passes("llvm")(mod)
    d, n = 2 * 32, 8
    big = sorted((batch, d, length, n))
    assert not [s for s in tensor_shapes(lowered) if sorted(s) == big], "a (B, D, L, N) tensor is left"
    assert_outputs_match(run_model(mod, [ids]), [logits(model, ids)], rtol=1e-4)


@pytest.mark.parametrize("length", [1, 3])
def test_mamba_short_prompts_match_pytorch(length):
    model = hf_mamba(2, state_size=16)
    ids = torch.randint(0, 64, (2, length), generator=torch.Generator().manual_seed(1))
    mod = sw.from_torch(model, (ids,))
    forms = {r.form for r in sw.find_recurrences(mod)}
    assert forms == (set() if length == 1 else {"selective"})
    assert_outputs_match(run_model(mod, [ids]), [logits(model, ids)], rtol=1e-4)


def test_mamba_bf16_weights_found_and_close_to_pytorch():
    model = hf_mamba(1, dtype=torch.bfloat16)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(2))
    mod = sw.from_torch(model, (ids,))
    found = sw.find_recurrences(mod)
    assert [(r.form, r.dtype) for r in found] == [("selective", "float32")], found
    got = run_model(mod, [ids])[0].astype(np.float32)
    want = logits(model, ids)
    assert np.abs(got - want).max() <= 0.05 * max(1.0, np.abs(want).max())


def mamba2(length, chunk, batch):
    torch.manual_seed(0)
    cfg = transformers.Mamba2Config(vocab_size=64, hidden_size=64, state_size=16, num_hidden_layers=2,
                                    expand=2, head_dim=16, num_heads=8, n_groups=1, conv_kernel=4,
                                    chunk_size=chunk)
    model = transformers.Mamba2ForCausalLM(cfg).eval()
    return model, torch.randint(0, 64, (batch, length), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("length,chunk,batch", [(33, 8, 2), (64, 16, 1)])
def test_mamba2_matches_pytorch(length, chunk, batch):
    """Its chunked scan reads ``A_cumsum[..., -1]``: TVM imports that as an out-of-bounds
    ``take(x, -1, mode="fast")`` (relative error ~1e-3 here without ``torch_repairs``)."""
    model, ids = mamba2(length, chunk, batch)
    mod = sw.from_torch(model, (ids,))
    assert_outputs_match(run_model(mod, [ids]), [logits(model, ids)], rtol=1e-5)


def test_negative_select_and_bool_cumsum_are_repaired():
    class Packed(torch.nn.Module):
        def forward(self, position_ids, x):
            starts = (position_ids[:, 1:] - position_ids[:, :-1] != 1).cumsum(-1)
            return starts, x[..., -1], x[:, -2], x[:, torch.tensor([-1, 0])]

    pos = torch.tensor([[0, 1, 2, 0, 1], [0, 1, 2, 3, 4]])
    x = torch.randn(2, 5, 3)
    mod = sw.from_torch(Packed(), (pos, x))
    text = mod.script()
    assert 'mode="fast"' not in text and 'dtype="bool") = R.cumsum' not in text
    want = Packed()(pos, x)
    got = run_model(mod, [pos, x])
    assert [g.dtype for g in got] == [np.int64, np.float32, np.float32, np.float32]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w.numpy())
    assert torch_repairs.repair(mod).script() == text     # repairing twice changes nothing


def test_integer_power_is_repaired():
    """TVM builds no integer ``power`` ("power only applies to float"): retention's gamma
    written ``1 - 2 ** (-5 - torch.arange(H))`` (all ones in PyTorch's integer arithmetic)."""
    class Powers(torch.nn.Module):
        def forward(self, x, e):
            return x * (1 - 2 ** (-5 - torch.arange(3))), 3 ** e, (-2) ** (e - 4), e ** 2

    x, e = torch.randn(2, 3), torch.tensor([0, 1, 2, 5, 9])
    mod = sw.from_torch(Powers(), (x, e))
    got = run_model(mod, [x, e])
    for g, w in zip(got, Powers()(x, e)):
        assert g.dtype == w.numpy().dtype
        np.testing.assert_array_equal(g, w.numpy())


def onnx_export(model, ids):
    import io
    import warnings

    import onnx

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = model

        def forward(self, input_ids):
            return self.lm(input_ids, use_cache=False).logits

    f = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")                # the TorchScript exporter's notices
        torch.onnx.export(Logits(), (ids,), f, dynamo=False, opset_version=17)
    return onnx.load_from_string(f.getvalue())


@pytest.mark.parametrize("layers", [1, 2])
def test_mamba_onnx_export_is_fused_and_matches_pytorch_and_onnxruntime(layers):
    """``torch.onnx.export`` of the same model: no-op ``Cast``s of the state, constant initial
    states deep in the graph, ``chunk`` bounds computed from ``Shape``; every layer is one
    selective scan, and the compiled model agrees with PyTorch and ONNX Runtime."""
    import onnxruntime

    model = hf_mamba(layers)
    ids = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(4))
    exported = onnx_export(model, ids)
    mod = sw.from_onnx(exported)
    found = sw.find_recurrences(mod, include_rejected=True)
    assert [(r.form, r.rejected, r.length) for r in found] == [("selective", False, 8)] * layers, found
    want = logits(model, ids)
    session = onnxruntime.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
    ort = session.run(None, {session.get_inputs()[0].name: ids.numpy()})[0]
    got = run_model(mod, [ids])
    assert_outputs_match(got, [want], rtol=1e-4)
    assert_outputs_match(got, [ort], rtol=1e-4)
