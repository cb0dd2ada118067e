"""Small PyTorch models with recurrences written the way users write them (a Python loop over
time), for the demo, the tests and the benchmarks.  Each factory returns (model, example inputs).
"""
import math

import torch
import torch.nn.functional as F
from torch import nn


def selective_scan_ref(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    """Mamba's reference selective scan (the loop ``mamba_ssm`` ships and users export).

    u, delta: (B, D, L); A: (D, N); B, C: (B, N, L); D: (D,); z: (B, D, L).
    """
    if delta_bias is not None:
        delta = delta + delta_bias[..., None]
    if delta_softplus:
        delta = F.softplus(delta)
    batch, dim, dstate = u.shape[0], A.shape[0], A.shape[1]
    x = A.new_zeros((batch, dim, dstate))
    delta_a = torch.exp(torch.einsum("bdl,dn->bdln", delta, A))
    delta_b_u = torch.einsum("bdl,bnl,bdl->bdln", delta, B, u)
    ys = []
    for i in range(u.shape[2]):
        x = delta_a[:, :, i] * x + delta_b_u[:, :, i]
        ys.append(torch.einsum("bdn,bn->bd", x, C[:, :, i]))
    y = torch.stack(ys, dim=2)
    out = y if D is None else y + u * D[:, None]
    return out if z is None else out * F.silu(z)


class MambaBlock(nn.Module):
    """One Mamba (S6) block: in_proj, causal depthwise conv1d, SiLU, x_proj, dt_proj + softplus,
    the selective scan as the reference loop, gating by silu(z), out_proj.  Input (B, L, d_model)."""

    def __init__(self, d_model=32, d_state=16, d_conv=4, expand=2):
        super().__init__()
        d_inner = expand * d_model
        self.dt_rank = math.ceil(d_model / 16)
        self.d_state = d_state
        self.in_proj = nn.Linear(d_model, 2 * d_inner, bias=False)
        self.conv1d = nn.Conv1d(d_inner, d_inner, d_conv, groups=d_inner, padding=d_conv - 1)
        self.x_proj = nn.Linear(d_inner, self.dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, d_inner, bias=True)
        with torch.no_grad():  # Mamba's dt initialization: softplus(bias) in [1e-3, 1e-1]
            dt = torch.exp(torch.rand(d_inner) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        self.A_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1, dtype=torch.float32).repeat(d_inner, 1)))
        self.D = nn.Parameter(torch.ones(d_inner))
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)

    def forward(self, hidden):
        length = hidden.shape[1]
        xz = self.in_proj(hidden).transpose(1, 2)                        # (B, 2*d_inner, L)
        x, z = xz.chunk(2, dim=1)
        x = F.silu(self.conv1d(x)[..., :length])
        x_dbl = self.x_proj(x.transpose(1, 2))                           # (B, L, R + 2N)
        dt, B, C = torch.split(x_dbl, [self.dt_rank, self.d_state, self.d_state], dim=-1)
        delta = (dt @ self.dt_proj.weight.t()).transpose(1, 2)            # (B, d_inner, L)
        A = -torch.exp(self.A_log)
        y = selective_scan_ref(x, delta, A, B.transpose(1, 2), C.transpose(1, 2), self.D, z,
                               delta_bias=self.dt_proj.bias, delta_softplus=True)
        return self.out_proj(y.transpose(1, 2))


class EMA(nn.Module):
    """Exponential moving average per channel with a learned decay: h_t = d*h + (1-d)*x_t."""

    def __init__(self, channels=16):
        super().__init__()
        self.logit = nn.Parameter(torch.randn(channels))

    def forward(self, x):                                                # (B, L, C)
        decay = torch.sigmoid(self.logit)
        h = torch.zeros(x.shape[0], x.shape[2])
        outs = []
        for t in range(x.shape[1]):
            h = decay * h + (1 - decay) * x[:, t]
            outs.append(h)
        return torch.stack(outs, dim=1)


class LinearRNN(nn.Module):
    """A gated linear RNN with an input state: h_t = sigmoid(W_a x_t) * h_{t-1} + W_b x_t,
    per-step gates computed by layers before the loop; returns states and the last state."""

    def __init__(self, d_in=8, d_hidden=16):
        super().__init__()
        self.gate = nn.Linear(d_in, d_hidden)
        self.inp = nn.Linear(d_in, d_hidden)

    def forward(self, x, h0):                                            # (B, L, d_in), (B, H)
        a = torch.sigmoid(self.gate(x))
        b = self.inp(x)
        h, outs = h0, []
        for t in range(x.shape[1]):
            h = a[:, t] * h + b[:, t]
            outs.append(h)
        return torch.stack(outs, dim=1), h


def mamba_block(length=64, batch=1, d_model=32, d_state=16, seed=0):
    torch.manual_seed(seed)
    return MambaBlock(d_model, d_state).eval(), (torch.randn(batch, length, d_model),)


def ema(length=64, batch=2, channels=16, seed=0):
    torch.manual_seed(seed)
    return EMA(channels).eval(), (torch.randn(batch, length, channels),)


def linear_rnn(length=64, batch=2, d_in=8, d_hidden=16, seed=0):
    torch.manual_seed(seed)
    return LinearRNN(d_in, d_hidden).eval(), (torch.randn(batch, length, d_in), torch.randn(batch, d_hidden))
