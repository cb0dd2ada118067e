"""Matrix-state layers written the way their home packages write them (fla's naive recurrent
references, fast-transformers' recurrent linear attention, HF's Mamba-2 cache path, mamba_ssm's
per-step SSD), and the near misses next to them: the PyTorch models that
``test_matrix_package_forms.py`` and ``test_matrix_package_near_misses.py`` import, kept apart
from the tests so both can.  Small sizes (H=2, K=4, V=5, L<=7) keep the tests fast."""
import torch
import torch.nn.functional as F
from torch import nn

B, H, L, DK, DV = 2, 2, 7, 4, 5


# -- the layers ----------------------------------------------------------------------------------
def gla_naive(q, k, v, gk, initial_state):
    """fla's naive recurrent GLA: (B, T, H, .) in, float32 state from ``new_zeros`` plus h0,
    ``o[:, :, i] = ...`` in place, ``.to(dtype)`` out, the final state returned."""
    dtype = q.dtype
    q, k, v, gk = map(lambda x: x.transpose(1, 2).float(), (q, k, v, gk))
    b, h, t, dk, dv = *q.shape, v.shape[-1]
    o = torch.zeros_like(v)
    scale = dk ** -0.5
    state = q.new_zeros(b, h, dk, dv, dtype=torch.float32)
    state += initial_state.float()
    for i in range(t):
        q_i = q[:, :, i] * scale
        gk_i = gk[:, :, i].exp()
        kv_i = k[:, :, i][..., None] * v[:, :, i][..., None, :]
        state = state * gk_i[..., None] + kv_i
        o[:, :, i] = (q_i[..., None] * state).sum(-2)
    return o.transpose(1, 2).to(dtype), state


def simple_gla_naive(q, k, v, g):
    """fla's simple GLA: one log gate per head, ``S.clone() * gate[..., None, None]``, q scaled
    before the loop, ``unsqueeze`` outer product and readout."""
    dtype = q.dtype
    q, k, v, g = map(lambda x: x.float(), (q, k, v, g))
    b, h, t, dk = q.shape
    q = q * dk ** -0.5
    state = q.new_zeros(b, h, dk, v.shape[-1])
    o = torch.zeros_like(v)
    for i in range(t):
        gate = g[:, :, i].exp()
        kv = k[:, :, i].unsqueeze(-1) * v[:, :, i].unsqueeze(-2)
        state = state.clone() * gate[..., None, None] + kv
        o[:, :, i] = (q[:, :, i, :].unsqueeze(-1) * state).sum(-2)
    return o.to(dtype), state


def retention_recurrent(q, k, v):
    """Retention's recurrent form: a fixed decay per head ``1 - 2 ** (-5 - arange(H))``,
    einsum outer product and readout, ``q @ S`` style scale on q."""
    b, h, t, dk = q.shape
    gamma = 1 - 2 ** (-5.0 - torch.arange(h, dtype=torch.float32))
    state = torch.zeros(b, h, dk, v.shape[-1])
    o = torch.zeros(b, h, t, v.shape[-1])
    for i in range(t):
        state = state * gamma.view(1, -1, 1, 1) + torch.einsum("bhk,bhv->bhkv", k[:, :, i], v[:, :, i])
        o[:, :, i] = torch.einsum("bhk,bhkv->bhv", q[:, :, i] * dk ** -0.5, state)
    return o


def linear_attention_naive(q, k, v, initial_state):
    """fla's naive recurrent linear attention: (B, T, H, .) throughout, einsum with spaces,
    ``o = torch.empty_like(v)`` written at ``o[:, t]``, ``S = S + initial_state``."""
    dtype = q.dtype
    scale = q.shape[-1] ** -0.5
    b, t, h, dk, dv = *q.shape, v.shape[-1]
    q, k, v = map(lambda x: x.to(torch.float32), (q, k, v))
    o = torch.empty_like(v)
    state = torch.zeros((b, h, dk, dv), dtype=torch.float32)
    state = state + initial_state
    for i in range(t):
        state = state + torch.einsum("b h k, b h v -> b h k v", k[:, i], v[:, i])
        o[:, i] = torch.einsum("b h k v, b h k -> b h v", state, q[:, i] * scale)
    return o.to(dtype), state


def linear_attention_recurrent(queries, keys, values):
    """fast-transformers' recurrent linear attention, one step per call: elu+1 feature maps,
    ``Si += ...`` from an empty memory, the normalizer inside a three-operand einsum."""
    n, t, h, dk = queries.shape
    memory, outs = None, []
    for i in range(t):
        q, k, value = F.elu(queries[:, i]) + 1, F.elu(keys[:, i]) + 1, values[:, i]
        if memory is None:
            s_i, z_i = torch.einsum("nhd,nhm->nhdm", k, value), k
        else:
            s_i, z_i = memory
            z_i = z_i + k
            s_i = s_i + torch.einsum("nhd,nhm->nhdm", k, value)
        z = 1.0 / (torch.einsum("nhd,nhd->nh", q, z_i) + 1e-6)
        outs.append(torch.einsum("nhd,nhdm,nh->nhm", q, s_i, z))
        memory = (s_i, z_i)
    return torch.stack(outs, dim=1)


def linear_attention_bmm(x_q, x_k, x_v):
    """Heads split from (B, T, H*D) by view/permute, flattened to (B*H) batches, ``torch.bmm``
    outer product and readout, merged back."""
    b, t, _ = x_q.shape

    def heads(x):
        return x.view(b, t, H, -1).permute(0, 2, 1, 3).reshape(b * H, t, -1)

    q, k, v = (F.elu(heads(x)) + 1 for x in (x_q, x_k, x_v))
    state = torch.zeros(b * H, q.shape[-1], v.shape[-1])
    outs = []
    for i in range(t):
        state = state + torch.bmm(k[:, i].unsqueeze(2), v[:, i].unsqueeze(1))
        outs.append(torch.bmm(q[:, i].unsqueeze(1), state).squeeze(1))
    return torch.stack(outs, 1).view(b, H, t, -1).permute(0, 2, 1, 3).reshape(b, t, -1)


def hgrn2_naive(q, f, v):
    """HGRN2: the forget gate over K decays the state and ``1 - f`` is the key."""
    dtype = q.dtype
    q, f, v = map(lambda x: x.float(), (q, f, v))
    b, h, t, dk = q.shape
    state = q.new_zeros(b, h, dk, v.shape[-1])
    o = torch.zeros_like(v)
    for i in range(t):
        g = f[:, :, i].exp()
        state = state * g[..., None] + (1 - g)[..., None] * v[:, :, i, None, :]
        o[:, :, i] = (q[:, :, i, :, None] * state).sum(-2)
    return o.to(dtype)


def ssd_recurrent(x, dt, A, Bm, Cm, D):
    """Mamba-2's per-step SSD: ``dA = exp(dt * A)`` per head, the einsum drive and readout,
    the D skip; (b, l, h, p) stacked at dim 1 and the final state returned."""
    b, l, h, p = x.shape
    state = torch.zeros(b, h, p, Bm.shape[-1])
    ys = []
    for t in range(l):
        dA = torch.exp(dt[:, t] * A)
        dBx = torch.einsum("bh,bn,bhp->bhpn", dt[:, t], Bm[:, t], x[:, t])
        state = state * dA[..., None, None] + dBx
        ys.append(torch.einsum("bhpn,bn->bhp", state, Cm[:, t]) + D[:, None] * x[:, t])
    return torch.stack(ys, dim=1), state


def ssd_recurrent_groups(x, dt, A, Bm, Cm, D):
    """Mamba-2 with ngroups > 1: B and C (b, l, g, n) repeated to the heads."""
    b, l, h, p = x.shape
    Bm = Bm.repeat_interleave(h // Bm.shape[2], dim=2)
    Cm = Cm.repeat_interleave(h // Cm.shape[2], dim=2)
    state = x.new_zeros(b, h, p, Bm.shape[-1])
    ys = []
    for t in range(l):
        dA = torch.exp(dt[:, t] * A)
        state = state * dA[..., None, None] + torch.einsum("bh,bhn,bhp->bhpn", dt[:, t], Bm[:, t], x[:, t])
        ys.append(torch.einsum("bhpn,bhn->bhp", state, Cm[:, t]) + D[:, None] * x[:, t])
    return torch.stack(ys, dim=1)


def mamba2_cache_steps(x, dt, A_log, Bm, Cm, D, dt_bias):
    """HF Mamba-2's cache path, one step per token: dt and A expanded to (h, p, n) before
    ``exp`` (a decay of the state's full shape that only varies per head), B and C expanded
    from groups and reshaped to heads, the readout by ``bmm`` on (b*h) batches."""
    b, l, h, p = x.shape
    g, n = Bm.shape[2], Bm.shape[3]
    A = -torch.exp(A_log.float())
    state = torch.zeros(b, h, p, n)
    ys = []
    for t in range(l):
        dt_t = dt[:, t][:, :, None].expand(b, h, p)
        dt_t = F.softplus(dt_t + dt_bias[..., None].expand(h, p))
        dA = torch.exp(dt_t[..., None] * A[..., None, None].expand(h, p, n))
        B_t = Bm[:, t][..., None, :].expand(b, g, h // g, n).contiguous().reshape(b, -1, n)
        C_t = Cm[:, t][..., None, :].expand(b, g, h // g, n).contiguous().reshape(b, -1, n)
        state = state * dA + (dt_t[..., None] * B_t[..., None, :]) * x[:, t][..., None]
        y = torch.bmm(state.view(b * h, p, n), C_t.view(b * h, n, 1)).view(b, h, p)
        ys.append(y + x[:, t] * D[..., None].expand(h, p))
    return torch.stack(ys, 1)


def ssd_state_update_steps(x, dt, Bm, Cm, D, z, dt_bias):
    """mamba_ssm's ``selective_state_update`` reference called per step: A repeated to
    (h, p, n) and dt to (b, h, p) by ``.repeat`` (the decay has the state's shape but varies
    per head), softplus with a bias, ``einsum("bhdn,bn->bhd")`` readout, D skip, z gate."""
    b, l, h, p = x.shape
    n = Bm.shape[-1]
    A = -torch.linspace(0.2, 1.0, h)[:, None, None].repeat(1, p, n)
    state = torch.zeros(b, h, p, n)
    ys = []
    for t in range(l):
        dt_t = F.softplus(dt[:, t][..., None].repeat(1, 1, p) + dt_bias[:, None])
        dA = torch.exp(dt_t[..., None] * A)
        dB = dt_t[..., None] * Bm[:, t][:, None, None, :]
        state = state * dA + dB * x[:, t][..., None]
        out = torch.einsum("bhdn,bn->bhd", state, Cm[:, t]) + x[:, t] * D[:, None]
        ys.append(out * F.silu(z[:, t]))
    return torch.stack(ys, 1)


def gla_decay_in_two_statements(q, k, v, gk, gv):
    """The decay as a product over two statements, one factor a feature slice of a step's
    value (``gv[:, :, i, :1]``), the other scaled by a constant: ``0.99 * (h * g)``."""
    b, h, t, dk = q.shape
    state = torch.zeros(b, h, dk, v.shape[-1])
    outs = []
    for i in range(t):
        state = 0.99 * (state * gk[:, :, i].exp()[..., None])
        state = state * torch.sigmoid(gv[:, :, i, :1])[..., None] + k[:, :, i, :, None] * v[:, :, i, None, :]
        outs.append((q[:, :, i, :, None] * state).sum(-2))
    return torch.stack(outs, 2)


def _gla_pass(q, k, v, g):
    b, h, t, dk = q.shape
    state = q.new_zeros(b, h, dk, v.shape[-1])
    o = torch.zeros_like(v)
    for i in range(t):
        state = state * g[:, :, i].exp()[..., None] + k[:, :, i][..., None] * v[:, :, i][..., None, :]
        o[:, :, i] = (q[:, :, i][..., None] * state).sum(-2)
    return o


def gsa_two_passes(q, k, v, s, g):
    """Gated slot attention as fla's naive form writes it: a GLA pass over the slots with the
    keys, a softmax over the slots, a second GLA pass with the values (two matrix scans, the
    second's q the first's softmaxed output)."""
    ok = _slots_pass(q, k, s, g)
    return _gla_pass(ok.softmax(-1), s, v, g)


def _slots_pass(q, k, s, g):
    """The keys pass: a (slots, K) state read out over K (its last dim)."""
    b, h, t, dk = q.shape
    state = q.new_zeros(b, h, s.shape[-1], dk)
    o = torch.zeros(b, h, t, s.shape[-1])
    for i in range(t):
        state = state * g[:, :, i].exp()[..., None] + s[:, :, i][..., None] * k[:, :, i][..., None, :]
        o[:, :, i] = (state * q[:, :, i][..., None, :]).sum(-1)
    return o


class TwoGLALayers(nn.Module):
    """Two GLA layers in one model (projections, heads by view/permute, a learned h0
    broadcast over the batch): two matrix scans."""

    def __init__(self, d=12):
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        self.w = nn.ParameterList([nn.Parameter(torch.randn(d, 4 * d, generator=gen) / d ** 0.5)
                                   for _ in range(2)])
        self.h0 = nn.Parameter(torch.randn(H, d // H, d // H, generator=gen))

    def layer(self, x, w):
        b, t, d = x.shape
        q, k, v, gk = (x @ w).view(b, t, 4, H, -1).permute(2, 0, 3, 1, 4).unbind(0)
        gk = F.logsigmoid(gk)
        state = self.h0.expand(b, -1, -1, -1)
        outs = []
        for i in range(t):
            state = state * gk[:, :, i].exp()[..., None] + k[:, :, i, :, None] * v[:, :, i, None, :]
            outs.append((q[:, :, i, :, None] * state).sum(-2))
        return x + torch.stack(outs, 2).transpose(1, 2).reshape(b, t, d)

    def forward(self, x):
        return self.layer(F.layer_norm(self.layer(x, self.w[0]), (x.shape[-1],)), self.w[1])


# -- near misses ---------------------------------------------------------------------------------
def delta_rule(q, k, v, beta):
    """DeltaNet: ``S += beta k (v - S^T k)^T``, affine in S only through a matrix coefficient
    ``I - beta k k^T`` (the matrix-scan spec takes a decay, not a matrix)."""
    b, h, t, dk = q.shape
    state = torch.zeros(b, h, dk, v.shape[-1])
    outs = []
    for i in range(t):
        k_i = k[:, :, i]
        v_new = (v[:, :, i] - (state * k_i[..., None]).sum(-2)) * beta[:, :, i, None]
        state = state + k_i.unsqueeze(-1) * v_new.unsqueeze(-2)
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, i], state))
    return torch.stack(outs, 2)


def normalized_state(q, k, v):
    """The state goes through a nonlinearity every step (``F.normalize``)."""
    b, h, t, dk = q.shape
    state = torch.zeros(b, h, dk, v.shape[-1])
    outs = []
    for i in range(t):
        state = F.normalize(0.9 * state + k[:, :, i, :, None] * v[:, :, i, None, :], dim=-1)
        outs.append((q[:, :, i, :, None] * state).sum(-2))
    return torch.stack(outs, 2)


def rwkv6_naive(r, k, v, w, u, initial_state):
    """RWKV-6: the readout reads the state before the update, plus the bonus ``u``."""
    dtype = r.dtype
    r, k, v, w, u = map(lambda x: x.float(), (r, k, v, w, u))
    b, h, t, dk = r.shape
    state = torch.zeros(b, h, dk, v.shape[-1])
    state += initial_state
    o = torch.zeros_like(v)
    for i in range(t):
        kv = k[:, :, i, :, None] * v[:, :, i, None, :]
        o[:, :, i] = ((state + u[None, ..., None] * kv) * (r[:, :, i] * dk ** -0.5)[..., None]).sum(-2)
        state = state * w[:, :, i].exp()[..., None] + kv
    return o.to(dtype), state


def gla_key_and_value_gates(q, k, v, gk, gv):
    """A decay over both K and V (fla's GLA with gk and gv): the spec's decay runs over one."""
    b, h, t, dk = q.shape
    state = torch.zeros(b, h, dk, v.shape[-1])
    outs = []
    for i in range(t):
        decay = gk[:, :, i].exp()[..., None] * gv[:, :, i].exp()[..., None, :]
        state = state * decay + k[:, :, i, :, None] * v[:, :, i, None, :]
        outs.append((q[:, :, i, :, None] * state).sum(-2))
    return torch.stack(outs, 2)


def retention_integer_gamma(q, k, v):
    """``1 - 2 ** (-5 - torch.arange(H))`` on integers: PyTorch makes every gamma 1 (an int
    tensor), and TVM cannot build an integer power at all."""
    b, h, t, dk = q.shape
    gamma = 1 - 2 ** (-5 - torch.arange(h))
    state = torch.zeros(b, h, dk, v.shape[-1])
    outs = []
    for i in range(t):
        state = gamma[:, None, None] * state + torch.einsum("bhk,bhv->bhkv", k[:, :, i], v[:, :, i])
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, i], state))
    return torch.stack(outs, 2)
