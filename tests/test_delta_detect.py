"""Delta-rule loops found by what they compute (``relax_pass/forms/delta/delta.py``) and replaced by one
``DeltaScanSpec`` scan, in the forms packages ship: fla-core's naive recurrent kernels
(delta rule, gated delta rule, KDA, Comba) and transformers' Qwen3-Next recurrent loop,
and in spellings users write (elementwise-sum reads, matmul reads).  Each is equal to what
the package computes; a matrix-state loop that is no delta rule is a near miss with its
reason, left as it was."""
import inspect
import warnings

import pytest
import torch
import torch.nn.functional as F

import scanweaver_tvm as sw
from relax_pass.fuse import fuse
from tests.harness import assert_outputs_match, run_model

with warnings.catch_warnings():
    warnings.simplefilter("ignore")       # "Triton is not supported on current platform"
    pytest.importorskip("fla.ops")
    from fla.ops.comba.naive import naive_recurrent_comba
    from fla.ops.delta_rule.naive import delta_rule_recurrence
    from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule
    from fla.ops.kda.naive import naive_recurrent_kda
from transformers.models.qwen3_next import modeling_qwen3_next

# transformers' own torch loop (with fla installed, the name dispatches to fla's Triton kernel)
torch_recurrent_gated_delta_rule = inspect.unwrap(modeling_qwen3_next.torch_recurrent_gated_delta_rule)

B, H, K, V = 1, 2, 4, 5


class Fn(torch.nn.Module):
    def __init__(self, fn, **kwargs):
        super().__init__()
        self.fn, self.kwargs = fn, kwargs

    def forward(self, *args):
        out = self.fn(*args, **self.kwargs)
        return tuple(o for o in out if o is not None) if isinstance(out, tuple) else out


def _rand(seed):
    gen = torch.Generator().manual_seed(seed)
    return lambda *shape: torch.randn(*shape, generator=gen)


def _check(model, args, length, **spec_fields):
    """One delta scan of ``length`` steps (its spec fields as given), nothing else found, no
    per-step state left, equal to the model."""
    mod = sw.from_torch(model, args)
    found = sw.find_recurrences(mod, include_rejected=True)
    assert [(r.form, r.rejected, r.length) for r in found] == [("delta", False, length)], found
    spec = found[0].delta.spec
    for name, want in spec_fields.items():
        assert getattr(spec, name) == want, (name, spec)
    new, _ = fuse(mod)
    assert new["main"].script().count("scanweaver.delta_scan") == 1
    with torch.no_grad():
        want = model(*args)
    want = [w.numpy() for w in (want if isinstance(want, tuple) else (want,))]
    assert_outputs_match(run_model(mod, list(args)), want, rtol=1e-4)
    return spec


@pytest.mark.parametrize("length", [2, 3, 9])
def test_fla_delta_rule(length):
    r = _rand(length)
    args = (r(B, H, length, K), F.normalize(r(B, H, length, K), dim=-1), r(B, H, length, V),
            r(B, H, length).sigmoid())
    _check(Fn(delta_rule_recurrence), args, length, decay="none", return_last_state=True)


def test_fla_delta_rule_with_initial_state():
    r = _rand(1)
    args = (r(B, H, 7, K), F.normalize(r(B, H, 7, K), dim=-1), r(B, H, 7, V), r(B, H, 7).sigmoid(),
            r(B, H, K, V))
    _check(Fn(delta_rule_recurrence), args, 7, decay="none")


@pytest.mark.parametrize("final", [True, False])
def test_fla_gated_delta_rule(final):
    r = _rand(2)
    args = (r(2, 6, H, K), F.normalize(r(2, 6, H, K), dim=-1), r(2, 6, H, V), r(2, 6, H).sigmoid(),
            F.logsigmoid(r(2, 6, H)), r(2, H, K, V))
    model = Fn(lambda q, k, v, b, g, h0: naive_recurrent_gated_delta_rule(
        q, k, v, b, g, initial_state=h0, output_final_state=final))
    _check(model, args, 6, decay="head", return_last_state=final)


def test_fla_kda_per_key_decay_and_grouped_heads():
    r = _rand(3)
    args = (r(B, 5, 1, K), F.normalize(r(B, 5, 1, K), dim=-1), r(B, 5, H, V), F.logsigmoid(r(B, 5, H, K)),
            r(B, 5, H).sigmoid())
    _check(Fn(naive_recurrent_kda, output_final_state=True), args, 5, decay="key", return_last_state=True)


def test_fla_comba_reads_with_its_own_p():
    r = _rand(4)
    args = (r(B, 6, H, K), F.normalize(r(B, 6, H, K), dim=-1), r(B, 6, H, V), F.normalize(r(B, 6, H, K), dim=-1),
            r(B, 6, H).sigmoid(), F.logsigmoid(r(B, 6, H)))
    _check(Fn(naive_recurrent_comba, output_final_state=True), args, 6, decay="head", separate_read=True)


def test_transformers_qwen3_next_recurrent_loop():
    """Grouped value heads (q/k repeated), q and k L2-normalized, initial and final state."""
    r = _rand(5)
    model = Fn(lambda q, k, v, g, b, h0: torch_recurrent_gated_delta_rule(
        q, k, v, g, b, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True))
    args = (r(B, 7, 1, K), r(B, 7, 1, K), r(B, 7, H, V), F.logsigmoid(r(B, 7, H)), r(B, 7, H).sigmoid(),
            r(B, H, K, V))
    _check(model, args, 7, decay="head", return_last_state=True)


class UserDelta(torch.nn.Module):
    """A delta rule as people write it: the read as a matmul, the update as an outer product
    by matmul, the decay a sigmoid gate, outputs stacked."""

    def forward(self, q, k, v, beta, gate):
        S = q.new_zeros(q.shape[0], q.shape[1], q.shape[-1], v.shape[-1])
        outs = []
        for t in range(q.shape[2]):
            S = S * torch.sigmoid(gate[:, :, t])[..., None, None]
            kt = k[:, :, t]
            read = (kt.unsqueeze(-2) @ S).squeeze(-2)
            u = (v[:, :, t] - read) * beta[:, :, t, None]
            S = S + kt.unsqueeze(-1) @ u.unsqueeze(-2)
            outs.append((q[:, :, t].unsqueeze(-2) @ S).squeeze(-2))
        return torch.stack(outs, dim=2)


def test_user_spelling_with_matmuls_and_a_sigmoid_decay():
    r = _rand(6)
    args = (r(2, H, 6, K), F.normalize(r(2, H, 6, K), dim=-1), r(2, H, 6, V), r(2, H, 6).sigmoid(), r(2, H, 6))
    _check(UserDelta(), args, 6, decay="head")


class NotDelta(torch.nn.Module):
    """A matrix state with a full (data-dependent) K x K transition: linear, no delta rule."""

    def forward(self, q, k, v, a):
        S = q.new_zeros(q.shape[0], q.shape[1], q.shape[-1], v.shape[-1])
        outs = []
        for t in range(q.shape[2]):
            S = torch.tanh(a[:, :, t]) @ S
            S = S + k[:, :, t, :, None] * v[:, :, t, None, :]
            outs.append((q[:, :, t, :, None] * S).sum(-2))
        return torch.stack(outs, dim=2)


def test_a_full_matrix_transition_is_a_near_miss():
    r = _rand(7)
    args = (r(B, H, 5, K), r(B, H, 5, K), r(B, H, 5, V), r(B, H, 5, K, K))
    model = NotDelta()
    mod = sw.from_torch(model, args)
    found = sw.find_recurrences(mod, include_rejected=True)
    misses = [r for r in found if r.form == "delta"]
    assert len(misses) == 1 and misses[0].rejected, found
    assert "neither a diagonal minus beta k p^T (a delta rule) nor a diagonal plus b a^T" in misses[0].reason, \
        misses[0].reason
    with torch.no_grad():
        want = model(*args).numpy()
    assert_outputs_match(run_model(mod, list(args)), [want], rtol=1e-4)


class PlainDelta(torch.nn.Module):
    """``S += k (v - S^T k)^T`` with no beta (beta = 1), written with einsum; reversed."""

    def forward(self, q, k, v):
        S = q.new_zeros(q.shape[0], q.shape[1], q.shape[-1], v.shape[-1])
        outs = []
        for t in reversed(range(q.shape[2])):
            kt = k[:, :, t]
            S = S + torch.einsum("bhk,bhv->bhkv", kt, v[:, :, t] - torch.einsum("bhk,bhkv->bhv", kt, S))
            outs.insert(0, torch.einsum("bhk,bhkv->bhv", q[:, :, t], S))
        return torch.stack(outs, dim=2)


def test_no_beta_einsum_spelling_run_backwards():
    r = _rand(8)
    args = (r(B, H, 5, K), 0.5 * F.normalize(r(B, H, 5, K), dim=-1), r(B, H, 5, V))
    _check(PlainDelta(), args, 5, decay="none", reverse=True)
