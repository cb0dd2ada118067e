"""bf16 checkpoints as users have them: a tiny config of each family saved with
``save_pretrained`` after ``.to(torch.bfloat16)``, given to ``sw.compile_causal_lm`` as the
directory (transformers 5 loads it as bf16, ``dtype="auto"``); greedy tokens equal transformers'
own bf16 ``generate``, and the logits no farther from an fp32 run of the same bf16 weights
than transformers' bf16 run is."""
import copy
import warnings

import numpy as np
import pytest
import torch
import transformers

import scanweaver_tvm as sw
from bench.generate import first_difference
from scanweaver_tvm.causal_lm import torch_kernels
from scanweaver_tvm.sequence_parallel.collective import in_threads
from test_causal_lm import _family
from test_causal_lm_hybrids import FAMILIES as HYBRIDS
from test_causal_lm_hybrids import _qwen3_5, _recurrent_gemma

T = transformers


def _mamba():
    return T.MambaForCausalLM(T.MambaConfig(vocab_size=96, hidden_size=32, state_size=8, num_hidden_layers=2,
                                            expand=2))


def _llama():
    return T.LlamaForCausalLM(T.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=64,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))


# one family per kind of layer (the float32 tests run every family): Falcon-Mamba is Mamba's
# layer, Bamba, GraniteMoeHybrid, Nemotron-H and Falcon-H1 are Mamba-2 layers and attention as
# Zamba2 has them, Zamba is Mamba's layer with Zamba2's shared attention (together 150 s of CI)
COVERED = ("falcon_mamba", "bamba", "granitemoehybrid", "nemotron_h", "falcon_h1", "zamba")
FAMILIES = {"mamba": _mamba, "llama": _llama, "mamba2": lambda: _family("mamba2")[0],
            "xlstm": lambda: _family("xlstm")[0], "rwkv": lambda: _family("rwkv")[0],
            "recurrent_gemma": _recurrent_gemma, "qwen3_5": _qwen3_5,
            **{name: make for name, (make, _, _) in HYBRIDS.items() if name not in COVERED}}


def _checkpoint(make, path):
    torch.manual_seed(0)
    make().eval().to(torch.bfloat16).save_pretrained(path)
    model = T.AutoModelForCausalLM.from_pretrained(path).eval()
    assert model.dtype == torch.bfloat16
    return model


def _assert_a_near_tie(family, model, got, want):
    """Where our greedy token differs from transformers' bf16 one, the two must be a tie within
    bf16's error (``bench.generate.first_difference``: in an fp32 run of the same bf16 weights,
    our token is within transformers' own bf16 error of the best).  Each such case is reported
    (a warning naming the family, the position and the margins)."""
    d = first_difference(model, got, want)
    assert d["ours_behind"] <= d["their_error"], (family, d)
    warnings.warn(f"{family}: at position {d['position']} our greedy token {d['ours']} differs from "
                  f"transformers' bf16 {d['theirs']}: a near tie (ours {d['ours_behind']:.4f} behind the "
                  f"best in fp32, theirs {d['theirs_behind']:.4f}; transformers' bf16 error {d['their_error']:.4f})")


# families whose build also prefills across ranks (threads), generating its own tokens
SPLIT = {"jamba": 2}


def _prompt(length):
    return torch.randint(3, 60, (1, length), generator=torch.Generator().manual_seed(length))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_bf16_checkpoint_generates_transformers_tokens(family, tmp_path):
    """Tokens equal transformers' bf16 ``generate`` (or differ at a near tie only:
    ``_assert_a_near_tie``).  The precision kept, on the families with a scan of each kind and
    attention: against the same bf16 weights run in fp32, our last
    logits err at most 1.5x what transformers' bf16 run errs (served as float32, as the
    prefill step returns every model's logits)."""
    model = _checkpoint(FAMILIES[family], tmp_path)
    lm = sw.compile_causal_lm(str(tmp_path), ranks=SPLIT.get(family))
    ids = _prompt(9)
    with torch.no_grad(), torch_kernels():
        want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=6)
    got = lm.generate(ids, max_new_tokens=6)
    if family in SPLIT:      # the bf16 keys and values all-gathered as bf16
        ranks = SPLIT[family]
        assert torch.equal(in_threads(ranks, lambda rank: lm.generate_split(ids, rank, max_new_tokens=6))[-1], got)
    if not torch.equal(got, want):
        _assert_a_near_tie(family, model, got, want)
    if family not in ("mamba", "mamba2", "llama", "qwen3_next"):
        return
    ids = _prompt(13)
    with torch.no_grad(), torch_kernels():
        exact = copy.deepcopy(model).float()(ids).logits[:, -1].double().numpy()
        theirs = model(ids).logits[:, -1].double().numpy()
    logits, _ = lm.prefill(ids)
    got = logits.numpy()
    assert got.dtype == np.float32
    ours_err, theirs_err = np.abs(got.astype(np.float64) - exact).max(), np.abs(theirs - exact).max()
    assert 0 < theirs_err and ours_err <= 1.5 * theirs_err, (ours_err, theirs_err)


def test_bf16_checkpoint_on_the_amx_kernel_generates_the_same_tokens(emulated_amx, monkeypatch, tmp_path):  # pylint: disable=redefined-outer-name
    """A whole bf16 Mamba whose prefill matmuls (symbolic rows) take the AMX kernel, run through
    its emulated tile file on this CPU: the same greedy tokens as the build without AMX, and
    prefill logits equal to float32 rounding (both accumulate the same bf16 products in
    float32, in another order).  An AMX host runs the native kernel (test_dense_cpu).  (One
    family: a hybrid's two compiles take 100 s.)"""
    from scanweaver_core.targets import host_target
    from tir_schedules import bf16_dot

    if not bf16_dot.available(host_target()):
        return                       # (the path around the tiles needs AVX512-BF16: Zen 4, Xeon)
    _checkpoint(FAMILIES["mamba"], tmp_path)
    ids = _prompt(37)
    on_amx = sw.compile_causal_lm(str(tmp_path))
    amx_logits, _ = on_amx.prefill(ids)
    amx_tokens = on_amx.generate(ids, max_new_tokens=4)
    assert emulated_amx, "no matmul took the AMX kernel"
    monkeypatch.undo()
    plain = sw.compile_causal_lm(str(tmp_path))
    logits, _ = plain.prefill(ids)
    assert torch.equal(amx_tokens, plain.generate(ids, max_new_tokens=4))
    np.testing.assert_allclose(amx_logits.numpy(), logits.numpy(), rtol=1e-4, atol=1e-4 * np.abs(logits.numpy()).max())
