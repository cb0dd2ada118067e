"""``sw.compile_causal_lm`` on hybrids: attention layers' keys and values in TVM's paged KV
cache (Kimi's MLA too, its v padded to the q/k head size; as tensors over a symbolic number of
positions seen when asked) next to the recurrent states, every family's prompt scans fused, and
``generate`` equal to transformers' token for token.  Tiny configs, random weights;
transformers' reference runs on its torch path (``torch_kernels``), as traced."""
import numpy as np
import pytest
import torch
import transformers

import scanweaver_tvm as sw
from scanweaver_tvm.causal_lm import torch_kernels
from test_chunked_forms import FAMILIES as MAMBA2_HYBRIDS
from test_sequence_parallel_models import check_generate_split

T = transformers
SMALL = dict(vocab_size=64, hidden_size=64, intermediate_size=64)


def _jamba():
    return T.JambaForCausalLM(T.JambaConfig(
        **SMALL, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, attn_layer_period=2,
        attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, num_experts=2, mamba_d_state=8,
        mamba_d_conv=4, mamba_expand=2))


def _zamba():
    return T.ZambaForCausalLM(T.ZambaConfig(
        **SMALL, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, attention_head_dim=32,
        mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, attn_layer_period=2, attn_layer_offset=0,
        n_mamba_heads=2))          # (layers 2 and 3 hybrid: Zamba ties its shared block across two)


def _qwen3_next():
    return T.Qwen3NextForCausalLM(T.Qwen3NextConfig(
        **SMALL, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, layer_types=["linear_attention", "full_attention"]))


def _qwen3_5():
    """Qwen3.5's text model: Gated DeltaNet and gated attention, a dense MLP (no experts).  Its
    test is its bf16 checkpoint's (test_bf16_checkpoints; Qwen3-Next covers the same layers in
    float32 here, and a second one would add 50 s)."""
    return T.Qwen3_5ForCausalLM(T.Qwen3_5TextConfig(
        **SMALL, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=4, layer_types=["linear_attention", "full_attention"]))


def _kimi_linear():
    return T.KimiLinearForCausalLM(T.KimiLinearConfig(
        **SMALL, moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        kv_lora_rank=16, qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=16, num_local_experts=4,
        num_experts_per_tok=2, linear_head_dim=16, linear_num_heads=2,
        layer_types=["linear_attention", "full_attention"], pad_token_id=0, bos_token_id=1, eos_token_id=2))


# name -> (model, the scan op its prompt's recurrences become, how many); all have their
# attention in the paged cache
FAMILIES = {
    **{name: (make, "scanweaver.matrix_scan", layers) for name, (make, layers) in MAMBA2_HYBRIDS.items()
       if name != "mamba2"},
    "jamba": (_jamba, "scanweaver.selective_scan", 1),
    "zamba": (_zamba, "scanweaver.selective_scan", 8),     # 4 layers x 2 mamba heads
    "qwen3_next": (_qwen3_next, "scanweaver.delta_scan", 1),
    "kimi_linear": (_kimi_linear, "scanweaver.delta_scan", 1),
}


# families whose build also prefills across ranks (sequence parallel: the whole-model target's
# second hybrid, next to Bamba's torchrun test in test_sequence_parallel_models; one build)
SPLIT = {"qwen3_next": 3}


def _expected(model, ids, new):
    with torch.no_grad(), torch_kernels():
        return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new)


def _prompt(batch, length, seed):
    return torch.randint(3, 64, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_hybrid_greedy_tokens_equal_transformers(family):
    """One executable per family: a prompt shorter than the conv window (decoded from zero
    states, the attention cache growing from empty) and one past Qwen3-Next's 64-token chunk,
    both equal to transformers' tokens; the prompt's recurrences are scans.  ``SPLIT``'s
    families are also prefilled across ranks from the same build."""
    make, op, count = FAMILIES[family]
    torch.manual_seed(0)
    model = make().eval()
    lm = sw.compile_causal_lm(model, ranks=SPLIT.get(family))
    assert lm.layout.paged and not any(s.grows for s in lm.layout.slots), (lm.layout.slots, lm.layout.not_paged)
    for length in (2, 70):
        ids = _prompt(1, length, length)
        assert torch.equal(lm.generate(ids, max_new_tokens=6), _expected(model, ids, 6)), (family, length)
    assert len(lm._built) == 1
    assert lm.module()["prefill"].script(show_meta=False).count(op) == count
    if family in SPLIT:
        check_generate_split(lm, model, SPLIT[family])


def test_hybrid_batch_of_two_and_states():
    """Batch 2 through Bamba; the paged cache (TVM's count) gains one position a step, in
    place, and refuses a step past the room it was made with.  A left-padded batch (of 2: the
    build already made): each row's sequence in the cache holds its own length, tokens equal
    transformers'."""
    make, _, _ = FAMILIES["bamba"]
    torch.manual_seed(0)
    model = make().eval()
    lm = sw.compile_causal_lm(model)
    ids = _prompt(2, 9, 4)
    assert torch.equal(lm.generate(ids, max_new_tokens=5), _expected(model, ids, 5))
    logits, states = lm.prefill(ids, max_length=10)
    cache, passed = states[0], states[1:]
    assert cache.sequence_lengths() == [9, 9]
    logits, states = lm.decode(logits.numpy().argmax(-1), states)
    assert states[0] is cache and cache.sequence_lengths() == [10, 10]
    assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(passed, states[1:]))   # in place
    with pytest.raises(ValueError, match="holds 10 tokens a sequence"):
        lm.decode(logits.numpy().argmax(-1), states)
    mask = torch.ones((2, 9), dtype=torch.long)
    mask[0, :7] = 0                      # 2 tokens: decoded into its sequence of the shared cache
    mask[1, :3] = 0
    padded = _prompt(2, 9, 5).masked_fill(mask == 0, 0)
    with torch.no_grad(), torch_kernels():
        want = model.generate(padded, attention_mask=mask, do_sample=False, max_new_tokens=5, pad_token_id=0)
    assert torch.equal(lm.generate(padded, attention_mask=mask, max_new_tokens=5), want)
    _, states = lm.prefill(padded, attention_mask=mask)
    assert states[0].sequence_lengths() == [2, 6]


def test_mla_caches_padded_in_the_paged_cache_or_tensors():
    """Kimi Linear's MLA attention (q/k head size 24, v 16) lives in one paged cache of head
    size 24 (v padded with zeros); asked for tensors, its caches grow by one a decode step, and
    both give transformers' tokens."""
    make, _, _ = FAMILIES["kimi_linear"]
    torch.manual_seed(0)
    model = make().eval()
    assert sw.compile_causal_lm(model).layout.paged.head_dim == 24
    lm = sw.compile_causal_lm(model, attention_cache="tensors")
    assert lm.layout.paged is None and "tensors" in lm.layout.not_paged
    ids = _prompt(1, 9, 4)
    assert torch.equal(lm.generate(ids, max_new_tokens=4), _expected(model, ids, 4))
    logits, states = lm.prefill(ids)
    keys = [i for i, s in enumerate(lm.layout.slots) if s.kind == "keys"]
    assert keys and [states[i].shape[2] for i in keys] == [9] * len(keys)
    _, states = lm.decode(logits.numpy().argmax(-1), states)
    assert [states[i].shape[2] for i in keys] == [10] * len(keys)


def test_attention_only_model_generates():
    """No recurrence at all (Llama, grouped queries): the same two entry points over the paged
    cache, batch 1 and 2, a prompt of one token (decoded into a fresh cache) and longer ones
    (130: past one query tile and two key blocks of the prefill kernel)."""
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(T.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=2, num_attention_heads=4,
                                             num_key_value_heads=2)).eval()
    lm = sw.compile_causal_lm(model)
    assert lm.layout.paged.layers == (0, 1) and lm.layout.slots == ()
    for batch, length in ((1, 1), (2, 12), (1, 33), (2, 130)):
        ids = _prompt(batch, length, length)
        assert torch.equal(lm.generate(ids, max_new_tokens=6), _expected(model, ids, 6)), (batch, length)


def _recurrent_gemma(window=16):
    """Griffin: two RG-LRU blocks (their conv windows and states in module attributes, not in
    the cache), then local attention over a window of ``window`` keys.  Weights drawn wider
    than the default init, whose tiny model emits one token over and over."""
    model = T.RecurrentGemmaForCausalLM(T.RecurrentGemmaConfig(
        **SMALL, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1, lru_width=64,
        attention_window_size=window, conv1d_width=4, block_types=["recurrent", "recurrent", "attention"])).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model


def test_recurrent_gemma_generates():
    """RecurrentGemma: the states it keeps on its modules are carried (and updated in place),
    its local attention lives in the paged cache with the window masked by our kernels, the
    prompt's RG-LRU recurrences are scans; tokens equal transformers' for prompts shorter than
    the conv window, longer than the attention window (16) and past it by decoding, batch 1
    and 2.  The model's own attributes are left as they were (transformers' generate after
    ours starts from them)."""
    torch.manual_seed(0)
    model = _recurrent_gemma()
    lm = sw.compile_causal_lm(model)
    assert [s.kind for s in lm.layout.slots] == ["module"] * 4, lm.layout.slots
    assert lm.layout.paged.layers == (2,) and lm.layout.paged.window == 16
    block = model.model.layers[0].temporal_block
    for batch, length in ((1, 2), (1, 40), (2, 7)):
        ids = _prompt(batch, length, length)
        held = block.conv1d_state                  # (None, then what transformers' run left)
        got = lm.generate(ids, max_new_tokens=24)
        assert block.conv1d_state is held
        assert torch.equal(got, _expected(model, ids, 24)), (batch, length)
        assert len(set(got[0, length:].tolist())) > 3            # not one token over and over
    assert lm.module()["prefill"].script(show_meta=False).count("scanweaver.affine_scan") == 2
    logits, states = lm.prefill(_prompt(1, 9, 1))
    before = [s.numpy() for s in states[1:]]
    _, after = lm.decode(logits.numpy().argmax(-1), states)
    assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(states[1:], after[1:]))   # in place
    assert not any(np.array_equal(a, b.numpy()) for a, b in zip(before, after[1:]))


def test_sliding_window_needs_the_paged_cache():
    """Sliding-window attention is carried in the paged cache only: asked for tensors, the
    error names the layers."""
    torch.manual_seed(0)
    with pytest.raises(NotImplementedError, match=r"cache layers \[2\] hold sliding-window attention.*tensors"):
        sw.compile_causal_lm(_recurrent_gemma(), attention_cache="tensors")
