"""The differential fuzzer: a fixed-seed subset of generated models must pass every check
(detection as expected, with and without the pass equal to PyTorch), the generator must emit
every form, and a failing case must be saved as a reproducer that runs on its own."""
import collections
import json
import os
import subprocess
import sys

import pytest
import torch
import tvm

import scanweaver_tvm as sw
from scanweaver_tvm import models
from scanweaver_tvm.fuzz import blocks, generate_case, with_expect
from scanweaver_tvm.fuzz.check import FLOOR, check_case, check_expectation, load

from harness import assert_outputs_match, run_model, torch_outputs

SUBSET = range(1000, 1100)          # small L: each case compiles in about a second
SUBSET_MAX_LENGTH = 5


def _seed_with(tag, min_length=8, max_length=24):
    """The first seed whose model has ``tag`` on a recurrence of L >= ``min_length`` (fp32)."""
    for seed in range(20000, 24000):
        case = generate_case(seed, max_length=max_length, dtype="float32")
        if tag in case.tags and any((e[1] or 0) >= min_length for e in case.expect["found"]):
            return seed
    raise AssertionError(f"no seed draws {tag}")


FAMILIES = [f"step:{k}" for k in blocks.STEP_FORMS] + ["slice:select_neg", "slice:narrow"]


@pytest.mark.parametrize("tag", FAMILIES)
def test_every_form_family_at_length_8_or_more(tag, tmp_path):
    """The make-test subset holds a case of every form family at L >= 8."""
    seed = _seed_with(tag)
    res = check_case(generate_case(seed, max_length=24, dtype="float32"), out_dir=str(tmp_path))
    assert res.status == "ok", f"{tag} (seed {seed}): {res.problems} (reproducer: {res.saved})"


@pytest.mark.parametrize("seed", SUBSET)
def test_generated_model(seed, tmp_path):
    res = check_case(generate_case(seed, max_length=SUBSET_MAX_LENGTH), out_dir=str(tmp_path))
    assert res.status == "ok", f"{res.problems} (reproducer: {res.saved})\n{res.detail[-3000:]}"


def _tags(seeds, **kw):
    return collections.Counter(t for s in seeds for t in generate_case(s, **kw).tags)


def test_generator_emits_every_form():
    tags = _tags(range(400))
    wanted = ([f"a:{k}" for k in blocks.PER_STEP_A + blocks.INVARIANT_A] + [f"b:{k}" for k in blocks.B_KINDS]
              + [f"init:{k}" for k in blocks.INITS] + [f"out:{k}" for k in blocks.OUTS]
              + [f"axis:{k}" for k in range(4)] + [f"near:{k}" for k in blocks.NEAR_MISSES]
              + ["forward", "reverse", "selective", "several", "chained", "float16", "float32"]
              + [f"layer:{k}" for k in ("linear", "matmul", "layer_norm", "silu", "relu", "gelu")]
              + [f"step:{k}" for k in (*blocks.STEP_FORMS, *blocks.SUM_FORMS)]
              + ["slice:select", "slice:index", "slice:ellipsis", "slice:select_neg", "slice:narrow"])
    missing = [w for w in wanted if tags[w] == 0]
    assert not missing, missing
    # the subset in make test covers the near misses too
    sub = _tags(SUBSET, max_length=SUBSET_MAX_LENGTH)
    assert all(sub[f"near:{k}"] for k in blocks.NEAR_MISSES), sub


def test_generator_is_deterministic_and_lengths_skew_small():
    assert generate_case(7).source == generate_case(7).source
    lengths = [e[1] for s in range(300) for e in generate_case(s).expect["found"] if e[1] is not None]
    assert max(lengths) > 128 and sorted(lengths)[len(lengths) // 2] <= 16, lengths


def test_forced_kinds_give_their_expectation():
    case = generate_case(3, kind="tanh", max_length=6)
    assert "relax.tanh" in case.expect["rejected"]
    assert generate_case(3, kind="selective", max_length=6).expect["found"][0][0] == "selective"
    ns = load(generate_case(5, dtype="float16").source)
    assert all(a.dtype == torch.float16 for a in ns["make_inputs"](0))


def test_check_expectation_compares_forms_lengths_and_reasons():
    class R:
        def __init__(self, form, length, axis, reverse, rejected=False, reason=""):
            self.form, self.length, self.axis, self.reverse = form, length, axis, reverse
            self.rejected, self.reason = rejected, reason

    recs = [R("affine", 7, 1, True), R("selective", 9, 2, False), R("affine", 1, -1, False, True, "x: relax.tanh")]
    ok = {"found": [["selective", 9, None, False], ["affine", 7, 1, True]], "rejected": ["relax.tanh"]}
    assert check_expectation(recs, ok) == []
    assert check_expectation(recs, dict(ok, found=[["affine", 7, 1, True]]))          # one too many
    assert check_expectation(recs, dict(ok, found=ok["found"] + [["affine", 3, 0, False]]))
    assert check_expectation(recs, dict(ok, found=[["selective", 9, None, False], ["affine", 7, 0, True]]))
    assert check_expectation(recs, dict(ok, rejected=["not consecutive"]))


def test_tolerances_are_principled():
    assert FLOOR["float32"] == 1e-4 and FLOOR["float16"] == 16 * 2.0 ** -11


def test_failure_is_saved_and_its_reproducer_runs_standalone(tmp_path):
    case = next(c for c in map(lambda s: generate_case(s, max_length=4), range(50))
                if c.expect["found"] and c.dtype == "float32" and "selective" not in c.tags
                and all(e[1] is not None for e in c.expect["found"]))
    wrong = dict(case.expect, found=[[f, n + 1, a, r] for f, n, a, r in case.expect["found"]])
    res = check_case(with_expect(case, wrong), out_dir=str(tmp_path))
    assert res.status == "detection" and res.saved, res
    assert os.path.exists(res.saved) and os.path.exists(res.saved[:-3] + ".txt")
    with open(res.saved) as f:
        assert "# detection at expectation" in f.read()
    # standalone: run the file by itself, from another folder, with this interpreter
    run = subprocess.run([sys.executable, res.saved], cwd=str(tmp_path), capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "detection" in run.stdout and "expected recurrences" in run.stdout, run.stdout
    # numbers were compared all the same: the model itself is fine
    assert res.errors["pass"] <= res.tolerance and res.errors["base"] <= res.tolerance


def test_cli_writes_a_summary(tmp_path):
    from scanweaver_tvm.fuzz.cli import main

    out = tmp_path / "out"
    rc = main(["--count", "2", "--seed", "1000", "--max-length", "3", "--workers", "1",
               "--out", str(out), "--failures", str(tmp_path / "fail")])
    summary = json.loads((out / "summary.json").read_text())
    assert rc == 0 and summary["count"] == 2 and summary["status"] == {"ok": 2}, summary
    assert len((out / "results.jsonl").read_text().splitlines()) == 2
    with pytest.raises(SystemExit):
        main(["--workers", "3"])


class SelectiveScan(torch.nn.Module):
    def __init__(self, dim, dstate):
        super().__init__()
        self.A_log = torch.nn.Parameter(torch.rand(dim, dstate))

    def forward(self, u, delta, B, C):
        return models.selective_scan_ref(u, delta, -torch.exp(self.A_log), B, C)


def test_einsums_import_as_written_when_torch_would_reorder_them():
    """torch contracts ``einsum`` in opt_einsum's order when that package is installed (jax
    brings it): the exported graph of an einsum-written selective scan then multiplies in
    another order and was found as a generic affine scan, not a selective one.  ``from_torch``
    exports with it off; the user's setting is kept."""
    assert torch.backends.opt_einsum.is_available()
    torch.manual_seed(0)
    model, (b, d, n, length) = SelectiveScan(4, 4).eval(), (2, 4, 4, 6)
    args = (torch.randn(b, d, length), torch.rand(b, d, length), torch.randn(b, n, length), torch.randn(b, n, length))
    with torch.backends.opt_einsum.flags(enabled=True, strategy="auto"):
        (rec,) = sw.find_recurrences(sw.from_torch(model, args))
        assert torch.backends.opt_einsum.enabled
    assert rec.form == "selective", rec


def test_selective_scan_with_as_many_states_as_channels():
    """Found by the fuzzer: with D == N, B (B, N, L) and u (B, D, L) have the same shape and the
    matcher took one for the other, leaving the scan unfused (correct, but not fused)."""
    torch.manual_seed(0)
    model, (b, d, n, length) = SelectiveScan(4, 4).eval(), (2, 4, 4, 6)
    args = (torch.randn(b, d, length), torch.rand(b, d, length), torch.randn(b, n, length), torch.randn(b, n, length))
    mod = sw.from_torch(model, args)
    (rec,) = sw.find_recurrences(mod)
    assert rec.form == "selective", rec
    assert_outputs_match(run_model(mod, args), torch_outputs(model, args))


class EMAFromFirstInput(torch.nn.Module):
    """h_0 = (1-d)*x_0 = b_0, then h_t = d*h + (1-d)*x_t, with (1-d) recomputed at each step."""

    def __init__(self):
        super().__init__()
        self.logit = torch.nn.Parameter(torch.randn(4))

    def forward(self, x):
        d = torch.sigmoid(self.logit)
        h = (1 - d) * x[:, 0]
        outs = [h]
        for t in range(1, x.shape[1]):
            h = d * h + (1 - d) * x[:, t]
            outs.append(h)
        return torch.stack(outs, 1)


def test_first_state_as_b0_with_coefficients_bound_after_it():
    """Found by the fuzzer (case 1063): the scan was emitted at h_0's binding, before the
    first step's coefficient ``1 - d`` was bound, and VM codegen failed ('Var is not defined')."""
    torch.manual_seed(0)
    model, args = EMAFromFirstInput().eval(), (torch.randn(2, 5, 4),)
    mod = sw.from_torch(model, args)
    (rec,) = sw.find_recurrences(mod)
    assert rec.length == 5
    assert_outputs_match(run_model(mod, args), torch_outputs(model, args))


class RunningSumFromFirstInput(torch.nn.Module):
    """h_0 = x_0, then h = x_t + h (a = 1, input first): both operands of a step are slices."""

    def __init__(self, reverse):
        super().__init__()
        self.reverse = reverse

    def forward(self, x):
        steps = list(range(x.shape[1]))[::-1] if self.reverse else list(range(x.shape[1]))
        h = x[:, steps[0]]
        for t in steps[1:]:
            h = x[:, t] + h
        return h


@pytest.mark.parametrize("reverse", [False, True])
def test_running_sum_from_first_input_reads_the_state_operand(reverse):
    """Found by the fuzzer (seed 102): the first step was read with the slice x_1 as its state
    and h_0 = x_0 as its input, so the chain's indices were [0, 2, 3, 4] and it was rejected."""
    model, args = RunningSumFromFirstInput(reverse), (torch.randn(2, 5, 3),)
    mod = sw.from_torch(model, args)
    (rec,) = sw.find_recurrences(mod, include_rejected=True)
    assert not rec.rejected, rec.reason
    assert (rec.length, rec.reverse) == (5, reverse)
    assert_outputs_match(run_model(mod, args), torch_outputs(model, args))


class LongNearMiss(torch.nn.Module):
    """h = tanh(g * h + x) or h = (0.5 + 0.1 * h) * h + x over many steps: not affine in h."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind

    def forward(self, x, g):
        h = torch.zeros_like(x[:, 0])
        for t in range(x.shape[1]):
            h = torch.tanh(g[:, t] * h + x[:, t]) if self.kind == "tanh" else (0.5 + 0.1 * h) * h + x[:, t]
        return h


@pytest.mark.parametrize("kind", ["tanh", "h_coefficient"])
def test_long_near_miss_is_rejected_without_recursing(kind):
    """Found by the fuzzer (seeds 505, 529, L = 472): coefficient templates nested the whole
    chain, and comparing them hit Python's recursion limit.  Keys are hash-consed now."""
    model, args = LongNearMiss(kind), (torch.randn(2, 400, 3), torch.rand(2, 400, 3))
    mod = sw.from_torch(model, args)
    found = sw.find_recurrences(mod, include_rejected=True)
    assert found and all(r.rejected for r in found), found
    tvm.ir.assert_structural_equal(sw.FuseAffineRecurrences()(mod), mod)


@pytest.mark.parametrize("seed,max_length", [(5133, 96), (5213, 96), (5226, 96), (8665, 128), (8728, 128),
                                             (8823, 128)])
def test_long_run_findings_stay_fixed(seed, max_length, tmp_path):
    """Missed detections the long runs found: lerp's per-step scalar weight (5133, 5213), an
    input initial state that exhausted the reading budget (5226), and coefficients through a
    LayerNorm or GELU that validation could not evaluate (8665, 8728, 8823)."""
    res = check_case(generate_case(seed, max_length=max_length), out_dir=str(tmp_path))
    assert res.status == "ok", f"{res.problems} (reproducer: {res.saved})"
