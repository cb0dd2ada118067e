"""Matrix scans written as a loop over blocks of rows (MiniMax's lightning attention, as
transformers ships it) and in the parallel (L, L) form (masked linear attention, a segsum
decay; fla's own parallel forms are in ``test_fla_naive_kernels.py``): each must be one matrix
scan, equal to PyTorch; softmax attention, whose (L, L) form is no scan, must be left alone
without a report."""
import numpy as np
import pytest
import torch

import scanweaver_tvm as sw

from harness import assert_outputs_match, run_model
from test_hf_models import tensor_shapes

transformers = pytest.importorskip("transformers")

BLOCK = 6


def _minimax(layer_types):
    torch.manual_seed(0)
    cfg = transformers.MiniMaxConfig(
        vocab_size=64, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=64, num_hidden_layers=len(layer_types), layer_types=layer_types,
        block_size=BLOCK, num_local_experts=2, num_experts_per_tok=1)
    return transformers.MiniMaxForCausalLM(cfg).eval()


class Logits(torch.nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        return self.lm(ids, use_cache=False).logits


@pytest.mark.parametrize("length", [20, 12, 7])
def test_minimax_lightning_block_loop_is_one_matrix_scan_per_linear_layer(length):
    """Blocks of 6 rows, the last one partial at L = 20 and 7; a constant decay per head (the
    slopes), read off the region's output.  Its MoE layer is traced through ``batched_mm``."""
    lm = Logits(_minimax(["linear_attention", "full_attention", "linear_attention"]))
    ids = torch.randint(0, 64, (2, length), generator=torch.Generator().manual_seed(length))
    mod = sw.from_torch(lm, (ids,))
    found = sw.find_recurrences(mod, include_rejected=True)
    assert [(r.form, r.length, r.rejected) for r in found] == [("matrix", length, False)] * 2, found
    spec = found[0].chunked.spec
    assert (spec.decay, spec.g_shape) == ("scalar", (1, 4, 1, 1))
    slopes = lm.lm.model.layers[0].self_attn.slope_rate.flatten().double()
    np.testing.assert_allclose(found[0].chunked.decay_values, torch.exp(-slopes).numpy(), rtol=1e-6)
    lowered = sw.passes("llvm")(mod)
    assert not [s for s in tensor_shapes(lowered) if (BLOCK, BLOCK) in zip(s, s[1:])], \
        "a (block, block) tensor is left"
    with torch.no_grad():
        want = lm(ids).numpy()
    assert_outputs_match(run_model(mod, [ids]), [want], rtol=1e-4)


class GatedBlockLoop(torch.nn.Module):
    """A loop over blocks of rows written as users write chunked GLA: a data-dependent log-decay
    per head and step, its cumsum within each block, the state passed from block to block."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, q, k, v, g):                 # (B, H, L, K), (B, H, L, K), (B, H, L, V), (B, H, L)
        b, h, length, dk = q.shape
        state = q.new_zeros(b, h, dk, v.shape[-1])
        out = []
        for start in range(0, length, self.block):
            stop = min(start + self.block, length)
            qi, ki, vi = q[:, :, start:stop], k[:, :, start:stop], v[:, :, start:stop]
            gi = torch.cumsum(g[:, :, start:stop], dim=-1)
            n = stop - start
            mask = torch.tril(torch.ones(n, n, dtype=torch.bool))
            decay = (gi[..., :, None] - gi[..., None, :]).masked_fill(~mask, float("-inf")).exp()
            intra = ((qi @ ki.transpose(-1, -2)) * decay) @ vi
            inter = (qi * gi.exp()[..., None]) @ state
            out.append(intra + inter)
            last = gi[..., -1:]
            state = state * last.exp()[..., None] + (ki * (last - gi).exp()[..., None]).transpose(-1, -2) @ vi
        return torch.cat(out, dim=2)


def _qkvg(b, h, length, dk, dv, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, length, dk, generator=g), torch.randn(b, h, length, dk, generator=g),
            torch.randn(b, h, length, dv, generator=g), -torch.rand(b, h, length, generator=g))


@pytest.mark.parametrize("length", [2, 11, 18])
def test_a_gated_block_loop_written_by_hand_is_a_matrix_scan(length):
    args = _qkvg(1, 3, length, 5, 4, length)      # (one block at L = 2: its parallel form)
    model = GatedBlockLoop(block=4)
    mod = sw.from_torch(model, args)
    found = sw.find_recurrences(mod, include_rejected=True)
    assert [(r.form, r.rejected) for r in found] == [("matrix", False)], found
    assert found[0].chunked.spec.decay == "scalar" and found[0].chunked.decay_values is None
    with torch.no_grad():
        want = model(*args).numpy()
    assert_outputs_match(run_model(mod, list(args)), [want], rtol=1e-4)


# ---------------------------------------------------------------- parallel (L, L) forms

class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def masked_linear_attention(q, k, v):
    length = q.shape[-2]
    return ((q @ k.transpose(-1, -2)) * torch.tril(torch.ones(length, length))) @ v


def segsum_attention(q, k, v, g):
    """Mamba-2's quadratic (SSD) form: ``exp(segsum(g))`` as the causal decay."""
    length = q.shape[-2]
    cs = torch.cumsum(g, dim=-1)
    seg = (cs[..., :, None] - cs[..., None, :]).masked_fill(
        ~torch.tril(torch.ones(length, length, dtype=torch.bool)), float("-inf"))
    return (torch.einsum("bhtk,bhsk->bhts", q, k) * seg.exp()) @ v


@pytest.mark.parametrize("fn,decay", [(masked_linear_attention, "none"), (segsum_attention, "scalar")])
def test_parallel_forms_are_matrix_scans(fn, decay):
    args = _qkvg(1, 2, 13, 4, 3, 5)[:3 if decay == "none" else 4]
    model = Fn(fn)
    mod = sw.from_torch(model, args)
    found = sw.find_recurrences(mod, include_rejected=True)
    assert [(r.form, r.rejected) for r in found] == [("matrix", False)], found
    assert found[0].chunked.spec.decay == decay
    with torch.no_grad():
        want = model(*args).numpy()
    assert_outputs_match(run_model(mod, list(args)), [want], rtol=1e-4)


def causal_softmax_attention(q, k, v):
    length = q.shape[-2]
    scores = (q @ k.transpose(-1, -2)).masked_fill(
        ~torch.tril(torch.ones(length, length, dtype=torch.bool)), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def squared_scores(q, k, v):
    """Causal, linear in v, but the scores squared: no scan (a near miss with its reason)."""
    length = q.shape[-2]
    return ((q @ k.transpose(-1, -2)) ** 2 * torch.tril(torch.ones(length, length))) @ v


def test_softmax_attention_is_left_alone_and_squared_scores_are_a_near_miss():
    args = _qkvg(1, 2, 9, 4, 3, 1)[:3]
    mod = sw.from_torch(Fn(causal_softmax_attention), args)
    assert sw.find_recurrences(mod, include_rejected=True) == []
    model = Fn(squared_scores)
    mod = sw.from_torch(model, args)
    found = sw.find_recurrences(mod, include_rejected=True)
    assert len(found) == 1 and found[0].rejected and "no assignment" in found[0].reason, found
    with torch.no_grad():
        want = model(*args).numpy()
    assert_outputs_match(run_model(mod, list(args)), [want], rtol=1e-5)
