"""Mamba's selective scan as different codebases write it: each must be found as ONE selective
scan (its (B, D, L, N) coefficient tensors gone) and compile to what PyTorch computes."""
import pytest
import torch
import torch.nn.functional as F

import scanweaver_tvm as sw

from harness import assert_outputs_match, run_model, torch_outputs


def minimal_style(u, delta, A, B, C, D):
    """mamba-minimal: (B, L, D) activations, time on axis 1, einsum readout, stack at dim 1."""
    b, l, d = u.shape
    delta_a = torch.exp(torch.einsum("bld,dn->bldn", delta, A))
    delta_bu = torch.einsum("bld,bln,bld->bldn", delta, B, u)
    x = torch.zeros(b, d, A.shape[1])
    ys = []
    for i in range(l):
        x = delta_a[:, i] * x + delta_bu[:, i]
        ys.append(torch.einsum("bdn,bn->bd", x, C[:, i, :]))
    return torch.stack(ys, dim=1) + u * D


def per_step_style(u, delta, A, B, C, D):
    """Coefficients computed inside the step from (B, D, L) / (B, N, L) slices, readout by
    multiply + sum, stack at -1, then the skip and a gate."""
    h = torch.zeros(u.shape[0], u.shape[1], A.shape[1])
    ys = []
    for t in range(u.shape[-1]):
        decay = torch.exp(delta[:, :, t, None] * A)
        h = decay * h + (delta[:, :, t] * u[:, :, t])[..., None] * B[:, None, :, t]
        ys.append((h * C[:, None, :, t]).sum(-1))
    y = torch.stack(ys, -1) + u * D[:, None]
    return y * F.silu(u)


def hf_style(u, delta, A, B, C, D):
    """transformers' loop: B, C as (B, L, N), matmul readout with casts, ``[..., 0]``,
    softplus(dt + bias) before."""
    dt = F.softplus(delta + D[:, None])
    discrete_a = torch.exp(A[None, :, None, :] * dt[:, :, :, None])
    delta_b_u = (dt[:, :, :, None] * B[:, None, :, :].float()) * u[:, :, :, None].float()
    h = torch.zeros(u.shape[0], u.shape[1], A.shape[1])
    ys = []
    for t in range(u.shape[2]):
        h = discrete_a[:, :, t] * h + delta_b_u[:, :, t]
        ys.append(torch.matmul(h.to(u.dtype), C[:, t, :].unsqueeze(-1))[:, :, 0])
    return torch.stack(ys, dim=-1)


STYLES = {"minimal": (minimal_style, "bld", "bln"), "per_step": (per_step_style, "bdl", "bnl"),
          "hf": (hf_style, "bdl", "bln")}


class Loop(torch.nn.Module):
    def __init__(self, style, dim, dstate):
        super().__init__()
        self.style = style
        self.A = torch.nn.Parameter(-torch.rand(dim, dstate) - 0.5)
        self.D = torch.nn.Parameter(torch.randn(dim))

    def forward(self, u, delta, B, C):
        return self.style(u, delta, self.A, B, C, self.D)


def layout(spec, b, d, n, l):
    return tuple({"b": b, "d": d, "n": n, "l": l}[c] for c in spec)


@pytest.mark.parametrize("sizes", [(2, 6, 4, 9), (2, 4, 4, 4), (1, 5, 3, 2)],
                         ids=["distinct", "all-alike", "two-steps"])
@pytest.mark.parametrize("style", list(STYLES))
def test_selective_spellings(style, sizes):
    b, d, n, l = sizes
    fn, act, bc = STYLES[style]
    torch.manual_seed(sum(sizes))
    model = Loop(fn, d, n)
    args = [torch.randn(layout(act, b, d, n, l)), torch.rand(layout(act, b, d, n, l)) * 0.5,
            torch.randn(layout(bc, b, d, n, l)), torch.randn(layout(bc, b, d, n, l))]
    mod = sw.from_torch(model, args)
    found = sw.find_recurrences(mod, include_rejected=True)
    assert [(r.form, r.rejected) for r in found] == [("selective", False)], found
    fused = sw.FuseAffineRecurrences()(mod)
    assert "scanweaver.selective_scan" in fused.script(show_meta=False)
    assert_outputs_match(run_model(mod, args), torch_outputs(model, args), rtol=1e-5)


def test_state_used_elsewhere_stays_an_affine_scan():
    """Returning the stacked states too is not the selective form (its states are needed)."""
    class Both(torch.nn.Module):
        def forward(self, u, delta, A, B, C):
            h = torch.zeros(u.shape[0], u.shape[1], A.shape[1])
            ys, hs = [], []
            for t in range(u.shape[2]):
                h = torch.exp(delta[:, :, t, None] * A) * h + (delta[:, :, t] * u[:, :, t])[..., None] * B[:, None, :, t]
                ys.append((h * C[:, None, :, t]).sum(-1))
                hs.append(h)
            return torch.stack(ys, -1), torch.stack(hs, 2)

    args = [torch.randn(2, 3, 5), torch.rand(2, 3, 5), -torch.rand(3, 4), torch.randn(2, 4, 5), torch.randn(2, 4, 5)]
    mod = sw.from_torch(Both(), args)
    assert [r.form for r in sw.find_recurrences(mod)] == ["affine"]
    assert_outputs_match(run_model(mod, args), torch_outputs(Both(), args), rtol=1e-5)


def test_a_reverse_selective_loop_says_why_it_stays_affine():
    class Reverse(torch.nn.Module):
        def forward(self, u, delta, A, B, C):
            h = torch.zeros(u.shape[0], u.shape[1], A.shape[1])
            ys = []
            for t in reversed(range(u.shape[2])):
                h = torch.exp(delta[:, :, t, None] * A) * h + (delta[:, :, t] * u[:, :, t])[..., None] * B[:, None, :, t]
                ys.append((h * C[:, None, :, t]).sum(-1))
            return torch.stack(ys[::-1], -1)

    args = [torch.randn(2, 3, 5), torch.rand(2, 3, 5), -torch.rand(3, 4), torch.randn(2, 4, 5), torch.randn(2, 4, 5)]
    (rec,) = sw.find_recurrences(sw.from_torch(Reverse(), args))
    assert (rec.form, rec.reverse) == ("affine", True)
    assert "not a forward scan" in rec.selective_miss
