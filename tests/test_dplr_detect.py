"""DPLR loops (``S_t = (D_t + b_t a_t^T) S_(t-1) + k_t v_t^T``) found by what they compute and
replaced by one ``DeltaScanSpec(rule="dplr")`` scan: fla-core's DPLR and IPLR recurrences as
shipped, and an RWKV-7-style loop as users write it.  Each equal to the package."""
import warnings

import pytest
import torch
import torch.nn.functional as F

from tests.test_delta_detect import Fn, _check, _rand

with warnings.catch_warnings():
    warnings.simplefilter("ignore")       # "Triton is not supported on current platform"
    pytest.importorskip("fla.ops")
    from fla.ops.generalized_delta_rule.dplr.naive import dplr_recurrence
    from fla.ops.generalized_delta_rule.iplr.naive import iplr_recurrence

B, H, K, V = 1, 2, 4, 5


def _rwkv7_operands(r, length, k=K):
    """RWKV-7's rank-1 term: ``a = -kk``, ``b = kk * gate`` (kk a unit key)."""
    kk = F.normalize(r(B, H, length, k), dim=-1)
    return -kk, kk * r(B, H, length, k).sigmoid()


@pytest.mark.parametrize("length", [2, 3, 9])
def test_fla_dplr_recurrence(length):
    r = _rand(length)
    a, b = _rwkv7_operands(r, length)
    args = (r(B, H, length, K), r(B, H, length, K), r(B, H, length, V), a, b, -r(B, H, length, K).sigmoid())
    _check(Fn(dplr_recurrence), args, length, rule="dplr", decay="key", return_last_state=True)


def test_fla_iplr_recurrence_with_initial_state():
    r = _rand(4)
    a, b = _rwkv7_operands(r, 7)
    args = (r(B, H, 7, K), r(B, H, 7, K), r(B, H, 7, V), a, b, r(B, H, K, V))
    _check(Fn(iplr_recurrence), args, 7, rule="dplr", decay="none")


class RWKV7Loop(torch.nn.Module):
    """RWKV-7's recurrence as a user writes it over a (B, H, K, V) state: the decay
    ``w = exp(-exp(w_raw))`` given as the factor itself, the read by einsum, the update by
    broadcasts."""

    def forward(self, r, w_raw, k, v, kk, gate):
        w = torch.exp(-torch.exp(w_raw))
        state = torch.zeros(r.shape[0], r.shape[1], r.shape[-1], v.shape[-1])
        outs = []
        for t in range(r.shape[2]):
            sa = torch.einsum("bhk,bhkv->bhv", -kk[:, :, t], state)
            state = (state * w[:, :, t, :, None] + (kk[:, :, t] * gate[:, :, t])[..., None] * sa[:, :, None, :]
                     + k[:, :, t, :, None] * v[:, :, t, None, :])
            outs.append(torch.einsum("bhk,bhkv->bhv", r[:, :, t], state))
        return torch.stack(outs, dim=2)


def test_rwkv7_style_loop():
    r = _rand(9)
    length = 6
    args = (r(B, H, length, K), r(B, H, length, K) - 1.0, r(B, H, length, K), r(B, H, length, V),
            F.normalize(r(B, H, length, K), dim=-1), r(B, H, length, K).sigmoid())
    _check(RWKV7Loop(), args, length, rule="dplr", decay="key", return_last_state=False)


class RWKV7Reference(torch.nn.Module):
    """RWKV-7 as its reference code writes the step: a (B, H, V, K) state, the transition
    ``diag(w) + (-kk)(kk a)^T`` applied on the right by a matmul, ``v k^T`` added, read out by
    ``state @ r``; the final state returned too."""

    def forward(self, r, w, k, v, kk, a, state):
        outs = []
        for t in range(r.shape[2]):
            vk = v[:, :, t, :, None] @ k[:, :, t, None, :]
            ab = (-kk[:, :, t, :, None]) @ (kk[:, :, t] * a[:, :, t])[:, :, None, :]
            state = state * w[:, :, t, None, :] + state @ ab + vk
            outs.append((state @ r[:, :, t, :, None]).squeeze(-1))
        return torch.stack(outs, dim=2), state


@pytest.mark.parametrize("length", [2, 7])
def test_rwkv7_reference_step_with_a_value_major_state(length):
    r = _rand(11 + length)
    kd, vd = 4, 6
    args = (r(B, H, length, kd), torch.exp(-torch.exp(r(B, H, length, kd) - 1.0)), r(B, H, length, kd),
            r(B, H, length, vd), F.normalize(r(B, H, length, kd), dim=-1), r(B, H, length, kd).sigmoid(),
            r(B, H, vd, kd))
    spec = _check(RWKV7Reference(), args, length, rule="dplr", decay="key", return_last_state=True)
    assert (spec.key, spec.value) == (kd, vd)
