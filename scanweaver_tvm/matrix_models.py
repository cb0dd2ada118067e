"""Layers with a matrix state per head, written as the per-step loops of reference code.

Each keeps ``S (B, H, K, V)`` with ``S = g_t * S + k_t v_t^T`` and reads ``o_t = q_t^T S``:
gated linear attention (decay over the key dim), retention (a fixed decay per head), linear
attention (no decay, with its normalizer) and Mamba-2 (a per-step decay per head, B and C
shared across heads, the D skip).  The loops are what ``FuseAffineRecurrences`` turns into one
``scanweaver.matrix_scan`` each; the projections, norms and gates around them stay ordinary
ops.  Small random weights; used by the tests, the benchmark and the CLI's examples.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn


def _rms(x, weight, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


class GLABlock(nn.Module):
    """Gated linear attention: ``gk = logsigmoid(low-rank(x)) / 16`` per key dim, output
    RMS-normed per head and gated by ``silu(g(x))``."""

    def __init__(self, d_model=64, heads=4, key_dim=16, value_dim=16, low_rank=8):
        super().__init__()
        self.heads, self.key_dim, self.value_dim = heads, key_dim, value_dim
        self.q = nn.Linear(d_model, heads * key_dim, bias=False)
        self.k = nn.Linear(d_model, heads * key_dim, bias=False)
        self.v = nn.Linear(d_model, heads * value_dim, bias=False)
        self.gk = nn.Sequential(nn.Linear(d_model, low_rank, bias=False), nn.Linear(low_rank, heads * key_dim))
        self.g = nn.Linear(d_model, heads * value_dim)
        self.norm = nn.Parameter(torch.ones(value_dim))
        self.o = nn.Linear(heads * value_dim, d_model, bias=False)

    def _heads(self, x, dim):
        b, l, _ = x.shape
        return x.view(b, l, self.heads, dim).transpose(1, 2)          # (B, H, L, dim)

    def forward(self, x):
        b, l, _ = x.shape
        q = self._heads(self.q(x), self.key_dim) * self.key_dim ** -0.5
        k, v = self._heads(self.k(x), self.key_dim), self._heads(self.v(x), self.value_dim)
        gk = self._heads(F.logsigmoid(self.gk(x)) / 16, self.key_dim)
        state = x.new_zeros(b, self.heads, self.key_dim, self.value_dim)
        outs = []
        for t in range(l):
            state = state * gk[:, :, t].exp()[..., None] + k[:, :, t, :, None] * v[:, :, t, None, :]
            outs.append((q[:, :, t, :, None] * state).sum(-2))
        o = _rms(torch.stack(outs, dim=2), self.norm)                   # (B, H, L, V)
        o = o.transpose(1, 2).reshape(b, l, -1)
        return self.o(o * F.silu(self.g(x)))


class RetentionBlock(nn.Module):
    """Multi-scale retention (RetNet, recurrent form): ``gamma_h = 1 - 2**(-5 - h)``, outer
    product and readout by ``matmul``, pieces concatenated along time, swish gate."""

    def __init__(self, d_model=64, heads=4, key_dim=16, value_dim=16):
        super().__init__()
        self.heads, self.key_dim, self.value_dim = heads, key_dim, value_dim
        self.qkv = nn.Linear(d_model, heads * (2 * key_dim + value_dim), bias=False)
        self.g = nn.Linear(d_model, heads * value_dim, bias=False)
        self.o = nn.Linear(heads * value_dim, d_model, bias=False)
        self.register_buffer("gamma", 1 - 2.0 ** (-5.0 - torch.arange(heads, dtype=torch.float32)))

    def forward(self, x):
        b, l, _ = x.shape
        q, k, v = self.qkv(x).view(b, l, self.heads, -1).transpose(1, 2).split(
            [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        k = k * self.key_dim ** -0.5
        state = x.new_zeros(b, self.heads, self.key_dim, self.value_dim)
        outs = []
        for t in range(l):
            state = self.gamma.view(1, -1, 1, 1) * state + k[:, :, t].unsqueeze(-1) @ v[:, :, t].unsqueeze(-2)
            outs.append(q[:, :, t].unsqueeze(-2) @ state)              # (B, H, 1, V)
        o = torch.cat(outs, dim=2)
        o = F.group_norm(o.transpose(1, 2).reshape(b * l, -1), self.heads).view(b, l, -1)
        return self.o(F.silu(self.g(x)) * o)


class LinearAttentionBlock(nn.Module):
    """Linear attention (Katharopoulos et al.) with ``elu + 1`` features and its normalizer,
    looping over ``unbind``ed (B, L, H, .) projections, stacked at dim 1."""

    def __init__(self, d_model=64, heads=4, key_dim=16, value_dim=16, eps=1e-6):
        super().__init__()
        self.heads, self.key_dim, self.value_dim, self.eps = heads, key_dim, value_dim, eps
        self.q = nn.Linear(d_model, heads * key_dim, bias=False)
        self.k = nn.Linear(d_model, heads * key_dim, bias=False)
        self.v = nn.Linear(d_model, heads * value_dim, bias=False)
        self.o = nn.Linear(heads * value_dim, d_model, bias=False)

    def forward(self, x):
        b, l, _ = x.shape
        q = F.elu(self.q(x).view(b, l, self.heads, -1)) + 1
        k = F.elu(self.k(x).view(b, l, self.heads, -1)) + 1
        v = self.v(x).view(b, l, self.heads, -1)
        state = x.new_zeros(b, self.heads, self.key_dim, self.value_dim)
        norm = x.new_zeros(b, self.heads, self.key_dim)
        outs = []
        for q_t, k_t, v_t in zip(q.unbind(1), k.unbind(1), v.unbind(1)):
            state = state + torch.einsum("bhk,bhv->bhkv", k_t, v_t)
            norm = norm + k_t
            num = torch.einsum("bhk,bhkv->bhv", q_t, state)
            den = torch.einsum("bhk,bhk->bh", q_t, norm)[..., None] + self.eps
            outs.append(num / den)
        return self.o(torch.stack(outs, dim=1).reshape(b, l, -1))


class Mamba2Block(nn.Module):
    """Mamba-2's mixer in its recurrent form (one group): ``h = exp(dt*A) h + dt x B^T`` per
    head over (P, N), ``y = h C + D x``, after a causal depthwise conv over (x, B, C); gated
    RMS norm and the output projection after the loop."""

    def __init__(self, d_model=64, heads=4, head_dim=16, d_state=16, d_conv=4):
        super().__init__()
        self.heads, self.head_dim, self.d_state = heads, head_dim, d_state
        d_inner = heads * head_dim
        conv_dim = d_inner + 2 * d_state
        self.in_proj = nn.Linear(d_model, 2 * d_inner + 2 * d_state + heads, bias=False)
        self.conv = nn.Conv1d(conv_dim, conv_dim, d_conv, groups=conv_dim, padding=d_conv - 1)
        self.dt_bias = nn.Parameter(torch.log(torch.expm1(torch.rand(heads) * 0.09 + 0.01)))
        self.A_log = nn.Parameter(torch.log(torch.arange(1, heads + 1, dtype=torch.float32)))
        self.D = nn.Parameter(torch.ones(heads))
        self.norm = nn.Parameter(torch.ones(d_inner))
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)

    def forward(self, hidden):
        b, l, _ = hidden.shape
        d_inner, n = self.heads * self.head_dim, self.d_state
        z, xbc, dt = self.in_proj(hidden).split([d_inner, d_inner + 2 * n, self.heads], dim=-1)
        xbc = F.silu(self.conv(xbc.transpose(1, 2))[..., :l].transpose(1, 2))
        x, B, C = xbc.split([d_inner, n, n], dim=-1)
        x = x.view(b, l, self.heads, self.head_dim)
        dt = F.softplus(dt + self.dt_bias)                                # (B, L, H)
        A = -torch.exp(self.A_log)
        state = hidden.new_zeros(b, self.heads, self.head_dim, n)
        ys = []
        for t in range(l):
            decay = torch.exp(dt[:, t] * A)                               # (B, H)
            drive = (dt[:, t, :, None] * x[:, t])[..., None] * B[:, t, None, None, :]
            state = state * decay[..., None, None] + drive
            ys.append((state * C[:, t, None, None, :]).sum(-1) + self.D[:, None] * x[:, t])
        y = torch.stack(ys, dim=1).reshape(b, l, d_inner)
        return self.out_proj(_rms(y * F.silu(z), self.norm))


BLOCKS = {"gla": GLABlock, "retention": RetentionBlock, "linear_attention": LinearAttentionBlock,
          "mamba2": Mamba2Block}


def example_input(length=16, batch=2, d_model=64, seed=0):
    torch.manual_seed(seed)
    return torch.randn(batch, length, d_model) * 0.5


def init_weights(model, seed=0, scale=0.3):
    """Deterministic small weights (``math.sqrt`` fan-in scaling) so outputs stay O(1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * scale / math.sqrt(p.shape[-1]))
    return model
