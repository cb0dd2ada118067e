"""``sw.compile_causal_lm``: a transformers causal LM served as ``prefill`` (any prompt length,
one executable) and ``decode`` (one token, states carried), and ``generate`` equal to
transformers' ``generate`` token for token.  Tiny configs, random weights."""
import numpy as np
import pytest
import torch
import transformers

import scanweaver_tvm as sw
from harness import assert_outputs_match


def tiny_mamba(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.MambaConfig(vocab_size=96, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2,
                                   conv_kernel=4)
    return transformers.MambaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def mamba():
    model = tiny_mamba()
    return model, sw.compile_causal_lm(model)


def _prompt(batch, length, seed):
    return torch.randint(0, 96, (batch, length), generator=torch.Generator().manual_seed(seed))


def _expected_generate(model, ids, **kwargs):
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, **kwargs)


@pytest.mark.parametrize("length", [1, 3, 4, 9, 37])
def test_greedy_tokens_equal_transformers(mamba, length):
    """One executable for every prompt length (shorter than the conv window: decoded from zero
    states; from it on: one prefill call over a symbolic L)."""
    model, lm = mamba
    ids = _prompt(1, length, length)
    got = lm.generate(ids, max_new_tokens=12)
    assert torch.equal(got, _expected_generate(model, ids, max_new_tokens=12))
    assert len(lm._built) == 1


@pytest.mark.parametrize("batch,length", [(1, 1025), (2, 1000), (1, 4096)])
def test_long_prompts_equal_transformers(mamba, batch, length):
    """The same executable at the issue's long prompts (to 4096), batch 1 and 2."""
    model, lm = mamba
    ids = _prompt(batch, length, length)
    assert torch.equal(lm.generate(ids, max_new_tokens=4), _expected_generate(model, ids, max_new_tokens=4))


def test_batch_of_two(mamba):
    model, lm = mamba
    ids = _prompt(2, 11, 5)
    got = lm.generate(ids, max_new_tokens=8)
    assert got.shape == (2, 19)
    assert torch.equal(got, _expected_generate(model, ids, max_new_tokens=8))


def test_prefill_and_decode_logits_and_states(mamba):
    """prefill's last-position logits and states, then one decode step, against the model's own
    forward with its cache."""
    model, lm = mamba
    ids = _prompt(1, 13, 7)
    logits, states = lm.prefill(ids)
    with torch.no_grad():
        cache = transformers.DynamicCache(config=model.config)
        want = model(ids, cache=cache, use_cache=True).logits[:, -1]
    assert_outputs_match([logits.numpy()], [want.numpy()], rtol=1e-4)
    for got, ref in zip(states, lm.layout.flatten(cache)):
        assert_outputs_match([got.numpy()], [ref.numpy()], rtol=1e-4)
    nxt = int(want.argmax(-1))
    before = [s.numpy() for s in states]
    passed, (logits, states) = states, lm.decode(np.array([nxt]), states)
    with torch.no_grad():
        want = model(torch.tensor([[nxt]]), cache=cache, use_cache=True).logits[:, -1]
    assert_outputs_match([logits.numpy()], [want.numpy()], rtol=1e-4)
    assert [tuple(s.shape) for s in states] == [s.shape for s in lm.layout.slots]
    for old, given, new in zip(before, passed, states):     # updated in place: no new state tensors
        assert np.array_equal(given.numpy(), new.numpy()) and not np.array_equal(old, new.numpy())


def test_sampling_is_seeded_and_valid(mamba):
    _, lm = mamba
    ids = _prompt(1, 6, 3)
    runs = []
    for _ in range(2):
        torch.manual_seed(123)
        runs.append(lm.generate(ids, max_new_tokens=10, do_sample=True, temperature=0.8, top_k=20, top_p=0.9))
    assert torch.equal(runs[0], runs[1])
    new = runs[0][:, 6:]
    assert new.shape == (1, 10) and int(new.min()) >= 0 and int(new.max()) < 96


def test_attention_mask_left_padded_rows_equal_transformers(mamba):
    """What a tokenizer returns (ids and a mask) goes in as transformers takes it: all ones, or
    left-padded rows of different lengths (one shorter than the conv window), each generating
    what transformers' generate gives the padded batch."""
    model, lm = mamba
    ids = _prompt(3, 9, 3)
    got = lm.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=5)
    assert torch.equal(got, _expected_generate(model, ids, max_new_tokens=5))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    mask[2, :7] = 0
    ids = ids.masked_fill(mask == 0, 0)
    with torch.no_grad():
        want = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=6, pad_token_id=0)
    assert torch.equal(lm.generate(ids, attention_mask=mask, max_new_tokens=6), want)
    assert lm.padding_refused() is None


@pytest.mark.parametrize("mask,match", [
    ([[1, 1, 1, 0, 0, 0], [1] * 6], "row 0 is not left-padded"),
    ([[0] * 6, [1] * 6], "row 0 is not left-padded"),
    ([[2] * 6, [1] * 6], "zeros .padding. and ones"),
    ([[1] * 5, [1] * 5], "attention_mask: shape"),
])
def test_bad_attention_masks_are_named(mamba, mask, match):
    _, lm = mamba
    with pytest.raises(ValueError, match=match):
        lm.generate(_prompt(2, 6, 3), attention_mask=torch.tensor(mask), max_new_tokens=2)


def test_padding_is_refused_where_transformers_ignores_the_mask():
    """RWKV computes a padded row differently from the row alone in transformers (it ignores
    the mask): refused by name, not served as the row alone."""
    model, _ = _family("rwkv")
    lm = sw.compile_causal_lm(model)
    assert "does not mask its padding" in lm.padding_refused()
    mask = torch.ones((2, 6), dtype=torch.long)
    mask[0, :2] = 0
    with pytest.raises(NotImplementedError, match="padded prompts: transformers' RwkvForCausalLM"):
        lm.generate(_prompt(2, 6, 3), attention_mask=mask, max_new_tokens=2)
    assert not lm._built


def test_eos_stops_generation(mamba):
    model, lm = mamba
    ids = _prompt(1, 8, 9)
    greedy = lm.generate(ids, max_new_tokens=6)
    eos = int(greedy[0, 9])                   # the second new token
    got = lm.generate(ids, max_new_tokens=6, eos_token_id=eos)
    assert torch.equal(got, _expected_generate(model, ids, max_new_tokens=6, eos_token_id=eos,
                                               pad_token_id=eos))


def test_module_has_both_entry_points(mamba):
    _, lm = mamba
    mod = lm.module()
    assert {"prefill", "decode"} <= {gv.name_hint for gv in mod.get_global_vars()}
    length = mod["prefill"].params[0].ty.shape.values[1]
    assert str(length) == "L"
    assert mod.script(show_meta=False).count("scanweaver.selective_scan") == 2     # one per layer


def test_bad_token_ids_are_named(mamba):
    _, lm = mamba
    with pytest.raises(ValueError, match="token ids"):
        lm.generate(np.zeros((1, 2, 3), dtype=np.int64))


def _family(name):
    torch.manual_seed(0)
    if name == "rwkv":         # its own state list (``state=``), not a transformers Cache
        cfg = transformers.RwkvConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, attention_hidden_size=32,
                                      intermediate_size=64, context_length=1024)
        return transformers.RwkvForCausalLM(cfg).eval(), "scanweaver.stabilized_scan"
    if name == "xlstm":        # its own xLSTMCache (it fails with a transformers DynamicCache)
        cfg = transformers.xLSTMConfig(vocab_size=96, hidden_size=128, num_heads=4, num_blocks=2, num_hidden_layers=2,
                                       chunk_size=8)
        return transformers.xLSTMForCausalLM(cfg).eval(), "scanweaver.mlstm_scan"
    if name == "falcon_mamba":
        cfg = transformers.FalconMambaConfig(vocab_size=96, hidden_size=32, state_size=8, num_hidden_layers=2,
                                             expand=2, conv_kernel=4)
        return transformers.FalconMambaForCausalLM(cfg).eval(), "scanweaver.selective_scan"
    cfg = transformers.Mamba2Config(vocab_size=96, hidden_size=64, state_size=16, num_hidden_layers=2, expand=2,
                                    head_dim=16, num_heads=8, n_groups=1, conv_kernel=4, chunk_size=8)
    return transformers.Mamba2ForCausalLM(cfg).eval(), "scanweaver.matrix_scan"


@pytest.mark.parametrize("family", ["falcon_mamba", "mamba2", "rwkv", "xlstm"])
def test_families_greedy_tokens_equal_transformers(family):
    """FalconMamba (normalized B, C, dt), Mamba-2 (chunked SSD in the prompt, a (heads,
    head_dim, N) state per layer), RWKV (its WKV, max-stabilized, over a state list of its
    own) and xLSTM (its mLSTM, in chunks of 8 in the prompt, over its own ``xLSTMCache``):
    each prompt's scans fused, tokens equal to transformers'."""
    model, op = _family(family)
    lm = sw.compile_causal_lm(model)
    for length in (2, 6, 21):
        ids = _prompt(1, length, length)
        got = lm.generate(ids, max_new_tokens=8)
        assert torch.equal(got, _expected_generate(model, ids, max_new_tokens=8)), (family, length)
    assert lm.module().script(show_meta=False).count(op) == 2


def test_cli_generate_prints_tokens_and_rates(tmp_path, capsys):
    """``scanweaver-tvm generate MODEL_DIR``: a saved checkpoint, greedy tokens equal to
    transformers', and the two rates."""
    from scanweaver_tvm import cli

    model = tiny_mamba(1)
    model.save_pretrained(tmp_path)
    ids = [5, 17, 3, 40, 22, 9]
    assert cli.main(["generate", str(tmp_path), "--prompt-ids", ",".join(map(str, ids)),
                     "--max-new-tokens", "5", "-q"]) == 0
    lines = capsys.readouterr().out.splitlines()
    want = _expected_generate(model, torch.tensor([ids]), max_new_tokens=5)[0, len(ids):].tolist()
    assert lines[0] == " ".join(map(str, want))
    assert lines[1].startswith("prefill: 6 tokens in ") and "tokens/s" in lines[1]
    assert lines[2].startswith("decode: 4 steps in ") and "tokens/s" in lines[2]


def test_cli_generate_bad_input_is_one_line(tmp_path, capsys):
    from scanweaver_tvm import cli

    assert cli.main(["generate", str(tmp_path / "missing"), "--prompt-ids", "1,2", "-q"]) == 2
    assert "no such checkpoint directory" in capsys.readouterr().err
    tiny_mamba().save_pretrained(tmp_path)
    assert cli.main(["generate", str(tmp_path), "--prompt-ids", "1,x", "-q"]) == 2
    assert "--prompt-ids: expected integers" in capsys.readouterr().err


def test_xlstm_batch_of_two_carries_its_batch_wide_counter():
    """xLSTM's own cache holds, next to each row's (C, n, m), one ``seqlen_offset`` for the
    whole batch: found by prefilling at batch 1 and 2, carried at its own shape; batch 2's
    tokens equal transformers'.  Padded rows are refused (no per-row counter to stack)."""
    model, _ = _family("xlstm")
    lm = sw.compile_causal_lm(model)
    unbatched = [s for s in lm.layout.slots if not s.batched]
    assert [(s.shape, s.dtype) for s in unbatched] == [((1,), "int64")]
    ids = _prompt(2, 11, 4)
    assert torch.equal(lm.generate(ids, max_new_tokens=6), _expected_generate(model, ids, max_new_tokens=6))
    assert "whole batch" in lm.padding_refused()
