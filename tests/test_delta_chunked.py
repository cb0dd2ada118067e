"""The gated delta rule in chunked (UT) form, as transformers ships it
(``torch_chunk_gated_delta_rule``: what Qwen3-Next runs for a prompt), found by what it
computes (``relax_pass/forms/delta/delta_chunked.py``) and replaced by one delta scan: padded and whole
chunks, grouped heads, q/k normalized in the kernel, initial and final states, and the whole
HF model; a five-tensor region that is no delta rule is a near miss with its reason."""
import inspect

import pytest
import torch
import torch.nn.functional as F
import transformers
from transformers.models.qwen3_next import modeling_qwen3_next

import scanweaver_tvm as sw
from tests.harness import assert_outputs_match, run_model
from tests.test_hf_models import tensor_shapes

# transformers' own torch functions (with fla installed, the names dispatch to fla's Triton
# kernels in eager mode; export takes the torch path either way)
TORCH_PATH = {n: inspect.unwrap(getattr(modeling_qwen3_next, n)) for n in (
    "torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn")}
chunk_rule = TORCH_PATH["torch_chunk_gated_delta_rule"]


class Chunked(torch.nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self.kwargs = kwargs

    def forward(self, q, k, v, g, beta, *state):
        out = chunk_rule(q, k, v, g, beta, initial_state=state[0] if state else None, **self.kwargs)
        return tuple(o for o in out if o is not None)


def _rand(seed):
    gen = torch.Generator().manual_seed(seed)
    return lambda *shape: torch.randn(*shape, generator=gen)


def _args(length, qk_heads=1, heads=2, key=4, value=5, state=False, seed=0):
    r = _rand(seed)
    out = (r(1, length, qk_heads, key), r(1, length, qk_heads, key), r(1, length, heads, value),
           F.logsigmoid(r(1, length, heads)), r(1, length, heads).sigmoid())
    return out + ((r(1, heads, key, value),) if state else ())


def _check(model, args, length, final):
    mod = sw.from_torch(model, args)
    found = sw.find_recurrences(mod, include_rejected=True)
    assert [(r.form, r.rejected, r.length) for r in found] == [("delta", False, length)], found
    spec = found[0].chunked_delta.spec
    assert (spec.decay, spec.return_last_state) == ("head", final), spec
    with torch.no_grad():
        want = [t.numpy() for t in model(*args)]
    assert_outputs_match(run_model(mod, list(args)), want, rtol=1e-4)
    return mod


@pytest.mark.parametrize("length,chunk", [(10, 4), (8, 4), (3, 4), (13, 8)])
def test_chunk_kernel_padded_or_whole_chunks(length, chunk):
    model = Chunked(chunk_size=chunk, use_qk_l2norm_in_kernel=True, output_final_state=True)
    _check(model, _args(length), length, final=True)


def test_chunk_kernel_initial_state_grouped_heads_no_final_state():
    model = Chunked(chunk_size=4, use_qk_l2norm_in_kernel=True)
    _check(model, _args(9, qk_heads=2, heads=4, state=True, seed=1), 9, final=False)


def test_chunk_kernel_equal_keys_and_values():
    """K = V: v is told from q and k by the products, not by its extent."""
    model = Chunked(chunk_size=4, use_qk_l2norm_in_kernel=True, output_final_state=True)
    _check(model, _args(7, key=4, value=4, seed=2), 7, final=True)


class NotADelta(torch.nn.Module):
    """The same five blocks (q, k, k beta, v beta, the log-decay), but no UT system and no
    state: decayed linear attention within each chunk, a region with the signature that is no
    delta rule."""

    def forward(self, q, k, v, g, beta):
        b, length, h, key = q.shape
        q, k, v, g, beta = (x.transpose(1, 2) for x in (q, k, v, g, beta))
        kb, vb = k * beta[..., None], v * beta[..., None]
        q, k, kb, vb = (x.reshape(b, h, -1, 4, x.shape[-1]) for x in (q, k, kb, vb))
        cum = g.reshape(b, h, -1, 4).cumsum(-1)
        decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(
            torch.ones(4, 4, dtype=torch.bool).triu(1), float("-inf")).exp()
        o = ((q @ k.transpose(-1, -2) + q @ kb.transpose(-1, -2)) * decay) @ vb
        return o.reshape(b, h, length, -1)


def test_a_five_tensor_region_that_is_no_delta_rule_is_a_near_miss():
    args = _args(8, seed=3)
    args = (args[0].expand(1, 8, 2, 4), args[1].expand(1, 8, 2, 4)) + args[2:]
    model = NotADelta()
    mod = sw.from_torch(model, args)
    found = sw.find_recurrences(mod, include_rejected=True)
    misses = [r for r in found if r.form == "delta"]
    assert len(misses) == 1 and misses[0].rejected, found
    assert "not a chunked delta rule" in misses[0].reason, misses[0].reason
    with torch.no_grad():
        want = model(*args).numpy()
    assert_outputs_match(run_model(mod, list(args)), [want], rtol=1e-4)


@pytest.fixture()
def torch_path(monkeypatch):
    for name, fn in TORCH_PATH.items():
        monkeypatch.setattr(modeling_qwen3_next, name, fn)


def test_hf_qwen3_next_gated_deltanet_layer_is_one_scan(torch_path):
    torch.manual_seed(0)
    cfg = transformers.Qwen3NextConfig(
        vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        head_dim=16, intermediate_size=64, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        layer_types=["linear_attention", "full_attention"], decoder_sparse_step=1)
    model = transformers.Qwen3NextForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (1, 20), generator=torch.Generator().manual_seed(1))
    mod = sw.from_torch(model, (ids,))
    found = [r for r in sw.find_recurrences(mod, include_rejected=True) if r.form == "delta"]
    assert [(r.rejected, r.length) for r in found] == [(False, 20)], found
    lowered = sw.passes("llvm")(mod)
    blocked = [s for s in tensor_shapes(lowered) if len(s) >= 5 and 64 in s]      # (B, H, chunks, 64, .)
    assert not blocked, f"a blocked tensor is left: {blocked[:3]}"
    with torch.no_grad():
        want = model(ids, use_cache=False).logits.numpy()
    assert_outputs_match(run_model(mod, [ids]), [want], rtol=1e-4)


# ---------------------------------------------------------------- KDA (Kimi Linear): a decay per key

from transformers.models.kimi_linear import modeling_kimi_linear  # noqa: E402

KIMI_TORCH_PATH = {n: inspect.unwrap(getattr(modeling_kimi_linear, n)) for n in (
    "chunk_kimi_delta_attention", "recurrent_kimi_delta_attention", "causal_conv1d_fn")
    if hasattr(modeling_kimi_linear, n)}


class ChunkedKDA(torch.nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self.kwargs = kwargs

    def forward(self, q, k, v, g, beta, *state):
        fn = KIMI_TORCH_PATH["chunk_kimi_delta_attention"]
        out = fn(q, k, v, g, beta, initial_state=state[0] if state else None, **self.kwargs)
        return tuple(o for o in out if o is not None)


@pytest.mark.parametrize("length,state", [(10, False), (8, True)])
def test_kimi_chunk_kda_per_key_decay(length, state):
    """q scaled after its padding (``pad(q) * K^-1/2``), the decay per key."""
    r = _rand(4)
    args = (r(1, length, 2, 4), r(1, length, 2, 4), r(1, length, 2, 5), F.logsigmoid(r(1, length, 2, 4)),
            r(1, length, 2).sigmoid()) + ((r(1, 2, 4, 5),) if state else ())
    model = ChunkedKDA(chunk_size=4, use_qk_l2norm_in_kernel=True, output_final_state=True)
    mod = sw.from_torch(model, args)
    found = sw.find_recurrences(mod, include_rejected=True)
    assert [(r.form, r.rejected, r.length) for r in found] == [("delta", False, length)], found
    assert found[0].chunked_delta.spec.decay == "key"
    with torch.no_grad():
        want = [t.numpy() for t in model(*args)]
    assert_outputs_match(run_model(mod, list(args)), want, rtol=1e-4)


@pytest.fixture()
def kimi_torch_path(monkeypatch):
    for name, fn in KIMI_TORCH_PATH.items():
        monkeypatch.setattr(modeling_kimi_linear, name, fn)


def test_hf_kimi_linear_kda_layer_is_one_scan(kimi_torch_path):
    """Kimi Linear tiny (a KDA layer, an MLA layer, MoE routed with ``topk(sorted=False)``)."""
    torch.manual_seed(0)
    cfg = transformers.KimiLinearConfig(
        vocab_size=64, hidden_size=64, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=16, qk_rope_head_dim=8, v_head_dim=16,
        qk_nope_head_dim=16, num_local_experts=4, num_experts_per_tok=2, linear_head_dim=16, linear_num_heads=2,
        layer_types=["linear_attention", "full_attention"], pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = transformers.KimiLinearForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (1, 20), generator=torch.Generator().manual_seed(2))
    mod = sw.from_torch(model, (ids,))
    found = [r for r in sw.find_recurrences(mod, include_rejected=True) if r.form == "delta"]
    assert [(r.rejected, r.length) for r in found] == [(False, 20)], found
    assert found[0].chunked_delta.spec.decay == "key"
    with torch.no_grad():
        want = model(ids, use_cache=False).logits.numpy()
    assert_outputs_match(run_model(mod, [ids]), [want], rtol=1e-4)


def test_fla_naive_chunk_gated_delta_rule():
    """fla-core's own chunked reference (a (B, H, L, 1) log-decay), initial and final state."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        naive = pytest.importorskip("fla.ops.gated_delta_rule.naive")
    r = _rand(5)
    args = (r(1, 8, 2, 4), F.normalize(r(1, 8, 2, 4), dim=-1), r(1, 8, 2, 5), r(1, 8, 2).sigmoid(),
            F.logsigmoid(r(1, 8, 2)), r(1, 2, 4, 5))

    class Fn(torch.nn.Module):
        def forward(self, q, k, v, beta, g, h0):
            return naive.naive_chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=4, initial_state=h0,
                                                      output_final_state=True)

    _check(Fn(), args, 8, final=True)
