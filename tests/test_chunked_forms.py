"""Matrix-state scans in their chunked form, as the packages ship them: transformers' Mamba-2
``mamba2_chunk_scan`` (its torch path, copied into Mamba2, Falcon-H1, Bamba, GraniteMoeHybrid,
Nemotron-H and Zamba2) and the minimal SSD reference.  Each Mamba-2 layer must become one
matrix scan with nothing of the blocked (chunks, chunk) form left after ``sw.pipeline``, and
the model must equal PyTorch."""
import pytest
import torch
import tvm
from tvm import relax

import scanweaver_tvm as sw

from harness import assert_outputs_match, run_model
from test_hf_models import tensor_shapes

transformers = pytest.importorskip("transformers")

CHUNK = 6           # distinct from every other extent below, so a blocked tensor is visible
MAMBA = dict(mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_n_heads=8, mamba_d_head=16,
             mamba_chunk_size=CHUNK)
COMMON = dict(vocab_size=64, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=64)


def _mamba2(groups=1, limit=(0.0, float("inf"))):
    return transformers.Mamba2ForCausalLM(transformers.Mamba2Config(
        vocab_size=64, hidden_size=64, state_size=16, num_hidden_layers=2, expand=2, head_dim=16,
        num_heads=8, n_groups=groups, conv_kernel=4, chunk_size=CHUNK, time_step_limit=limit))


FAMILIES = {   # name -> (model, Mamba-2 layers)
    "mamba2": (lambda: _mamba2(), 2),
    "falcon_h1": (lambda: transformers.FalconH1ForCausalLM(transformers.FalconH1Config(
        **COMMON, num_hidden_layers=2, **MAMBA, mamba_n_groups=1, mamba_d_ssm=128, head_dim=16)), 2),
    "bamba": (lambda: transformers.BambaForCausalLM(transformers.BambaConfig(
        **COMMON, num_hidden_layers=2, attn_layer_indices=[1], **MAMBA, mamba_n_groups=1)), 1),
    "granitemoehybrid": (lambda: transformers.GraniteMoeHybridForCausalLM(transformers.GraniteMoeHybridConfig(
        **COMMON, num_hidden_layers=2, layer_types=["mamba", "attention"], num_local_experts=0,
        shared_intermediate_size=64, **MAMBA, mamba_n_groups=1)), 1),
    "nemotron_h": (lambda: transformers.NemotronHForCausalLM(transformers.NemotronHConfig(
        **COMMON, num_hidden_layers=3, hybrid_override_pattern="M*-", ssm_state_size=16,
        mamba_num_heads=8, mamba_head_dim=16, n_groups=1, chunk_size=CHUNK, head_dim=16)), 1),
    "zamba2": (lambda: transformers.Zamba2ForCausalLM(transformers.Zamba2Config(
        vocab_size=64, hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
        intermediate_size=64, num_hidden_layers=2, layers_block_type=["mamba", "hybrid"],
        mamba_d_state=16, mamba_headdim=16, n_mamba_heads=8, chunk_size=CHUNK, mamba_ngroups=1,
        attention_head_dim=16)), 2),
}


def _logits(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=False).logits.float().numpy()


def _blocked(shapes, length):
    """Shapes of the blocked form: a (CHUNK, CHUNK) pair (weights within a chunk), or a
    (chunks, CHUNK) pair in a tensor of rank 5 or more (batch, blocks, head, feature)."""
    chunks = -(-length // CHUNK)
    return [s for s in shapes if any(s[i:i + 2] == (CHUNK, CHUNK) or (s[i:i + 2] == (chunks, CHUNK)
                                                                     and len(s) >= 5)
                                     for i in range(len(s) - 1))]


def _check(model, ids, layers):
    mod = sw.from_torch(model, (ids,))
    found = sw.find_recurrences(mod)
    assert [(r.form, r.length) for r in found] == [("matrix", ids.shape[1])] * layers, found
    assert all(r.chunked is not None for r in found)
    # (a near miss may remain: the chain finder reads two layers' norms as two steps)
    assert all(r.form == "affine" for r in sw.find_recurrences(mod, include_rejected=True) if r.rejected)
    lowered = sw.passes("llvm")(mod)
    assert not _blocked(tensor_shapes(lowered), ids.shape[1]), "a blocked (chunks, chunk) tensor is left"
    assert_outputs_match(run_model(mod, [ids]), [_logits(model, ids)], rtol=1e-4)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_mamba2_family_is_one_matrix_scan_per_layer(family):
    make, layers = FAMILIES[family]
    torch.manual_seed(0)
    model = make().eval()
    ids = torch.randint(0, 64, (1, 20), generator=torch.Generator().manual_seed(1))   # padded: 20 -> 24
    _check(model, ids, layers)


@pytest.mark.parametrize("batch,length", [(2, 2), (1, 3), (2, 12), (1, 25)])
def test_mamba2_lengths_and_batches(batch, length):
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (batch, length), generator=torch.Generator().manual_seed(length))
    _check(_mamba2().eval(), ids, 2)


def test_mamba2_one_token_is_left_as_it_is():
    """One step is no scan (as for Mamba-1's loop): nothing found, and still equal."""
    model = _mamba2().eval()
    ids = torch.randint(0, 64, (2, 1), generator=torch.Generator().manual_seed(0))
    mod = sw.from_torch(model, (ids,))
    assert sw.find_recurrences(mod, include_rejected=True) == []
    assert_outputs_match(run_model(mod, [ids]), [_logits(model, ids)], rtol=1e-4)


def test_mamba2_groups_and_time_step_limit():
    """``n_groups > 1`` (B and C repeated from groups to heads) and a clamped dt."""
    torch.manual_seed(0)
    model = _mamba2(groups=2, limit=(0.01, 0.2)).eval()
    ids = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(4))
    _check(model, ids, 2)


# ---------------------------------------------------------------- the minimal SSD reference

def _segsum(x):
    t = x.size(-1)
    cs = torch.cumsum(x, dim=-1)
    seg = cs[..., :, None] - cs[..., None, :]
    mask = torch.tril(torch.ones(t, t, dtype=torch.bool), diagonal=0)
    return seg.masked_fill(~mask, -torch.inf)


class MinimalSSD(torch.nn.Module):
    """``ssd_minimal_discrete`` as Mamba-2's authors state it (written here with reshapes for
    einops' rearrange): X (b, l, h, p), A (b, l, h), B and C (b, l, h, n), an initial state
    (b, h, p, n); returns Y and the final state."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, X, A, B, C, h0):
        b, length, h, p = X.shape
        c = length // self.block
        X, A, B, C = (t.reshape(b, c, self.block, *t.shape[2:]) for t in (X, A, B, C))
        A = A.permute(0, 3, 1, 2)
        A_cumsum = torch.cumsum(A, dim=-1)
        L = torch.exp(_segsum(A))
        Y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", C, B, L, X)
        decay_states = torch.exp(A_cumsum[:, :, :, -1:] - A_cumsum)
        states = torch.einsum("bclhn,bhcl,bclhp->bchpn", B, decay_states, X)
        states = torch.cat([h0[:, None], states], dim=1)
        decay_chunk = torch.exp(_segsum(torch.nn.functional.pad(A_cumsum[:, :, :, -1], (1, 0))))
        new_states = torch.einsum("bhzc,bchpn->bzhpn", decay_chunk, states)
        states, final_state = new_states[:, :-1], new_states[:, -1]
        Y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", C, states, torch.exp(A_cumsum))
        return (Y_diag + Y_off).reshape(b, length, h, p), final_state


def test_minimal_ssd_with_initial_and_final_state():
    b, length, h, p, n = 2, 24, 3, 5, 7
    g = torch.Generator().manual_seed(0)
    args = (torch.randn(b, length, h, p, generator=g), -torch.rand(b, length, h, generator=g),
            torch.randn(b, length, h, n, generator=g), torch.randn(b, length, h, n, generator=g),
            torch.randn(b, h, p, n, generator=g))
    model = MinimalSSD(block=CHUNK)
    mod = sw.from_torch(model, args)
    found = sw.find_recurrences(mod, include_rejected=True)
    assert [(r.form, r.rejected) for r in found] == [("matrix", False)], found
    spec = found[0].chunked.spec
    assert (spec.has_h0, spec.return_last_state, spec.decay) == (True, True, "scalar")
    with torch.no_grad():
        want = [t.numpy() for t in model(*args)]
    assert_outputs_match(run_model(mod, list(args)), want, rtol=1e-4)


class NotAScan(MinimalSSD):
    """The same blocks, but the intra-chunk weights squared: linear in X only."""

    def forward(self, X, A, B, C, h0):
        b, length, h, p = X.shape
        c = length // self.block
        X, A, B, C = (t.reshape(b, c, self.block, *t.shape[2:]) for t in (X, A, B, C))
        A = torch.cumsum(A.permute(0, 3, 1, 2), dim=-1)
        G = torch.einsum("bclhn,bcshn->bhcls", C, B) ** 2
        Y = torch.einsum("bhcls,bcshp->bclhp", G * torch.exp(A)[..., None], X)
        return Y.reshape(b, length, h, p)


def test_a_blocked_region_that_is_not_a_scan_is_a_near_miss_with_its_reason():
    b, length, h, p, n = 1, 12, 2, 3, 4
    g = torch.Generator().manual_seed(0)
    args = (torch.randn(b, length, h, p, generator=g), -torch.rand(b, length, h, generator=g),
            torch.randn(b, length, h, n, generator=g), torch.randn(b, length, h, n, generator=g),
            torch.randn(b, h, p, n, generator=g))
    model = NotAScan(block=CHUNK)
    mod = sw.from_torch(model, args[:4] + (args[4],))
    found = sw.find_recurrences(mod, include_rejected=True)
    assert len(found) == 1 and found[0].rejected and "not a matrix scan" in found[0].reason, found
    assert "no assignment" in found[0].reason
    with torch.no_grad():
        want = model(*args).numpy()
    assert_outputs_match(run_model(mod, list(args)), [want], rtol=1e-5)


class GatedInside(MinimalSSD):
    """The SSD's diagonal blocks with a fifth blocked tensor (a gate per step and head) inside
    the region: a chunked form the matcher does not take, so its near miss must be reported
    (a reason that mentions "blocked tensors" was once taken for a quiet one)."""

    def forward(self, X, A, B, C, Z):
        b, length, h, p = X.shape
        c = length // self.block
        X, A, B, C, Z = (t.reshape(b, c, self.block, *t.shape[2:]) for t in (X, A, B, C, Z))
        L = torch.exp(_segsum(A.permute(0, 3, 1, 2)))
        Y = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", C, B, L, X * torch.sigmoid(Z)[..., None])
        return Y.reshape(b, length, h, p)


def test_a_region_reading_five_blocked_tensors_is_reported():
    b, length, h, p, n = 1, 12, 2, 3, 4
    g = torch.Generator().manual_seed(0)
    args = (torch.randn(b, length, h, p, generator=g), -torch.rand(b, length, h, generator=g),
            torch.randn(b, length, h, n, generator=g), torch.randn(b, length, h, n, generator=g),
            torch.randn(b, length, h, generator=g))
    model = GatedInside(block=CHUNK)
    mod = sw.from_torch(model, args)
    found = sw.find_recurrences(mod, include_rejected=True)
    assert len(found) == 1 and found[0].rejected, found
    assert "reads 5 blocked tensors" in found[0].reason, found[0].reason
    with torch.no_grad():
        want = model(*args).numpy()
    assert_outputs_match(run_model(mod, list(args)), [want], rtol=1e-5)


def test_mamba2_imported_length_generic_runs_past_its_chunk():
    """With the region a scan and its padding gone (``relax_pass/unpad.py``), nothing in the
    module depends on the chunk count: one import serves every L, shorter and longer than a
    chunk (traced at L = 3, 5, 7, all within one chunk)."""
    model = _mamba2().eval()
    ids = torch.randint(0, 64, (1, 5), generator=torch.Generator().manual_seed(0))
    dim = torch.export.Dim
    mod = sw.from_torch(model, (ids,), dynamic_shapes={"input_ids": {0: dim("batch"), 1: dim("L")}})
    assert "nn.pad" not in mod.script() and "matrix_scan" in mod.script()
    ex = sw.compile(mod, "llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for batch, length in ((1, 2), (2, 6), (1, 20), (2, 41)):
        x = torch.randint(0, 64, (batch, length), generator=torch.Generator().manual_seed(length))
        got = vm["main"](tvm.runtime.tensor(x.numpy()))[0].numpy()
        assert_outputs_match([got], [_logits(model, x)], rtol=1e-4)


def test_mamba2_one_group_reads_b_and_c_once_for_all_heads():
    """With one group, B and C are repeated to every head before the blocks; the scan reads
    them below that repeat, shared by the heads (as the kernel takes them)."""
    model = _mamba2().eval()
    ids = torch.randint(0, 64, (1, 20), generator=torch.Generator().manual_seed(0))
    mod = sw.from_torch(model, (ids,))
    specs = [r.chunked.spec for r in sw.find_recurrences(mod)]
    assert [(s.q_shape[1], s.k_shape[1], s.v_shape[1]) for s in specs] == [(1, 1, 8)] * 2


# ---------------------------------------------------------------- chunk-wise linear attention

import torch.nn.functional as F  # noqa: E402


class ChunkSimpleGLA(torch.nn.Module):
    """fla's naive chunk simple GLA as that package writes it (written here): (B, T, H, .)
    inputs, g the per-head log decay, padded to the chunk, an unrolled loop over chunks
    carrying S, in-place output writes, the padding sliced off."""
    def __init__(self, chunk):
        super().__init__(); self.chunk = chunk
    def forward(self, q, k, v, g):
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
        g = g.transpose(1, 2)
        T = q.shape[-2]; BT = self.chunk
        pad = (BT - T % BT) % BT
        if pad:
            q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
            g = F.pad(g, (0, pad))
        scale = q.shape[-1] ** -0.5
        q = q * scale
        B, H, T1, K = q.shape
        V = v.shape[-1]
        n = T1 // BT
        q, k, v = (x.reshape(B, H, n, BT, x.shape[-1]) for x in (q, k, v))
        decay = g.reshape(B, H, n, BT).cumsum(-1)
        L_mask = ((decay.unsqueeze(-1) - decay.unsqueeze(-2)).tril().exp()).tril()
        S = k.new_zeros(B, H, K, V)
        o = torch.zeros_like(v)
        for i in range(n):
            q_i, k_i, v_i = q[:, :, i], k[:, :, i], v[:, :, i]
            attn = q_i @ k_i.transpose(-1, -2) * L_mask[:, :, i]
            o_inter = (q_i * decay[:, :, i, :, None].exp()) @ S
            o[:, :, i] = o_inter + attn @ v_i
            S = S * decay[:, :, i, -1, None, None].exp() + (k_i * (decay[:, :, i, -1, None] - decay[:, :, i]).exp()[..., None]).transpose(-1, -2) @ v_i
        o = o.reshape(B, H, n * BT, V)[:, :, :T]
        return o.transpose(1, 2)


@pytest.mark.parametrize("length", [21, 24])
def test_chunk_simple_gla_loop_is_one_matrix_scan(length):
    b, h, k, v = 2, 3, 8, 5
    g = torch.Generator().manual_seed(0)
    args = (torch.randn(b, length, h, k, generator=g), torch.randn(b, length, h, k, generator=g),
            torch.randn(b, length, h, v, generator=g), -torch.rand(b, length, h, generator=g))
    model = ChunkSimpleGLA(CHUNK)
    mod = sw.from_torch(model, args)
    found = sw.find_recurrences(mod, include_rejected=True)
    assert [(r.form, r.rejected, r.length) for r in found] == [("matrix", False, length)], found
    assert found[0].chunked.spec.decay == "scalar"
    with torch.no_grad():
        want = model(*args).numpy()
    assert_outputs_match(run_model(mod, list(args)), [want], rtol=1e-4)
    lowered = sw.passes("llvm")(mod)
    assert not _blocked(tensor_shapes(lowered), length)


class ChunkGLA(torch.nn.Module):
    """fla-style naive chunk GLA: a per-key log decay gk (B, T, H, K), chunks of C, the
    intra-chunk attention through exp of cumulated gates, the state passed chunk to chunk."""
    def __init__(self, chunk):
        super().__init__(); self.chunk = chunk
    def forward(self, q, k, v, gk):
        q, k, v, gk = (x.transpose(1, 2) for x in (q, k, v, gk))
        B, H, T, K = q.shape
        V = v.shape[-1]
        C = self.chunk
        n = T // C
        q = q * K ** -0.5
        q, k, v, gk = (x.reshape(B, H, n, C, x.shape[-1]) for x in (q, k, v, gk))
        gk = gk.cumsum(-2)
        S = q.new_zeros(B, H, K, V)
        o = torch.zeros_like(v)
        mask = torch.triu(torch.ones(C, C, dtype=torch.bool), diagonal=1)
        for i in range(n):
            q_i, k_i, v_i, g_i = q[:, :, i], k[:, :, i], v[:, :, i], gk[:, :, i]
            qg = q_i * g_i.exp()
            kg = k_i * (-g_i).exp()
            attn = (qg @ kg.transpose(-1, -2)).masked_fill(mask, 0)
            o[:, :, i] = qg @ S + attn @ v_i
            last = g_i[:, :, -1]
            S = S * last.exp()[..., None] + (k_i * (last[:, :, None] - g_i).exp()).transpose(-1, -2) @ v_i
        return o.reshape(B, H, T, V).transpose(1, 2)


def test_chunk_gla_with_a_key_decay_is_one_matrix_scan():
    b, length, h, k, v = 2, 24, 3, 8, 5
    g = torch.Generator().manual_seed(0)
    args = (torch.randn(b, length, h, k, generator=g), torch.randn(b, length, h, k, generator=g),
            torch.randn(b, length, h, v, generator=g), -0.3 * torch.rand(b, length, h, k, generator=g))
    model = ChunkGLA(CHUNK)
    mod = sw.from_torch(model, args)
    found = sw.find_recurrences(mod, include_rejected=True)
    assert [(r.form, r.rejected, r.length) for r in found] == [("matrix", False, length)], found
    assert found[0].chunked.spec.decay == "key"
    with torch.no_grad():
        want = model(*args).numpy()
    assert_outputs_match(run_model(mod, list(args)), [want], rtol=1e-4)
