"""torch.logcumsumexp (as a stabilized scan) and torch.exp2 through sw.from_torch / sw.compile,
against PyTorch; minGRU's parallel (log-space, Heinsen) mode, as minGRU-pytorch writes it."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import scanweaver_tvm as sw
from tests.harness import assert_outputs_match, run_model, torch_outputs


class LogCumSumExp(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.logcumsumexp(x, dim=self.dim)


class Exp2(nn.Module):
    def forward(self, x, n):
        return torch.exp2(x), torch.exp2(n), 1 - torch.exp2(-5 - torch.arange(4, dtype=torch.float32))


def _compile_and_compare(model, args, rtol=1e-5):
    mod = sw.from_torch(model, args)
    got = run_model(mod, args)
    assert_outputs_match(got, torch_outputs(model, args), rtol=rtol)
    return mod


@pytest.mark.parametrize("dim", [1, -1, 0])
def test_logcumsumexp_extreme_values(dim):
    """x uniform in [-100, 100] (exp overflows and underflows float32), some -inf entries."""
    x = torch.rand(3, 40, 6, generator=torch.Generator().manual_seed(0)) * 200 - 100
    x[0, :5, 0] = -torch.inf
    x[1, 3, :] = -torch.inf
    mod = sw.from_torch(LogCumSumExp(dim), (x,))
    assert "scanweaver.stabilized_scan" in mod.script()
    got = run_model(mod, (x,))[0]
    want = torch.logcumsumexp(x, dim=dim).numpy()
    assert np.array_equal(np.isneginf(got), np.isneginf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6, atol=1e-5)
    with np.errstate(over="ignore", divide="ignore"):   # what the unstabilized form gives
        naive = torch.log(torch.cumsum(torch.exp(x), dim=dim)).numpy()
    assert not np.allclose(naive[finite], want[finite], rtol=1e-3)


@pytest.mark.parametrize("shape, dim", [((7,), 0), ((2, 3, 1, 5), 2), ((4, 1), 0), ((2, 9), -1)])
def test_logcumsumexp_shapes(shape, dim):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1)) * 10
    _compile_and_compare(LogCumSumExp(dim), (x,))


def test_logcumsumexp_half():
    x = torch.randn(2, 50, 8, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16) * 30
    mod = sw.from_torch(LogCumSumExp(1), (x,))
    import tvm
    from tvm import relax
    vm = relax.VirtualMachine(sw.compile(mod, "llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x.view(torch.int16).numpy().view("bfloat16")))
    got = got[0] if not hasattr(got, "numpy") else got
    want = torch.logcumsumexp(x.float(), dim=1).numpy()   # fp32 state, rounded once at the end
    np.testing.assert_allclose(got.numpy().astype(np.float32), want, rtol=1e-2, atol=1e-2)


def test_exp2():
    x = torch.randn(3, 5) * 20
    n = torch.arange(-4, 6)
    _compile_and_compare(Exp2(), (x, n), rtol=1e-6)


def _log_g(x):
    return torch.where(x >= 0, (F.relu(x) + 0.5).log(), -F.softplus(-x))


class MinGRUWritten(nn.Module):
    """minGRU's parallel mode written as minGRU-pytorch's README/appendix writes it: a_star
    padded with a leading 0, log_values with log(h0) in front (here h0 = 1), the first step
    dropped at the end."""

    def __init__(self, dim):
        super().__init__()
        self.to_hidden_and_gate = nn.Linear(dim, dim * 2, bias=False)

    def forward(self, x):
        hidden, gate = self.to_hidden_and_gate(x).chunk(2, dim=-1)
        log_coeffs = -F.softplus(gate)
        log_values = -F.softplus(-gate) + _log_g(hidden)
        a_star = F.pad(torch.cumsum(log_coeffs, dim=1), (0, 0, 1, 0))
        log_values = F.pad(log_values, (0, 0, 1, 0), value=0.0)   # log(h0) = 0 in front
        log_h0_plus_b_star = torch.logcumsumexp(log_values - a_star, dim=1)
        log_h = a_star + log_h0_plus_b_star
        return torch.exp(log_h)[:, 1:]


def test_mingru_written_form():
    torch.manual_seed(3)
    model = MinGRUWritten(16).eval()
    x = torch.randn(2, 64, 16)
    mod = _compile_and_compare(model, (x,), rtol=1e-5)
    assert mod.script().count("scanweaver.stabilized_scan") == 1


@pytest.mark.parametrize("prev", [False, True])
def test_mingru_pytorch_package(prev):
    """minGRU-pytorch's own module (pinned in the dev extra), parallel mode, L = 128; with a
    previous hidden state (concatenated as log(prev) in front) too."""
    from minGRU_pytorch import minGRU

    torch.manual_seed(4)
    model = minGRU(24, expansion_factor=1.5).eval()
    x = torch.randn(2, 128, 24)
    args = (x, torch.rand(2, 1, 36) + 0.1) if prev else (x,)
    mod = _compile_and_compare(model, args, rtol=1e-5)
    assert "scanweaver.stabilized_scan" in mod.script()


LCSE_MODELS = """
import torch
from torch import nn


class LogCumSumExp(nn.Module):
    def forward(self, x):
        return torch.logcumsumexp(x, dim=1)


def lcse(length=12):
    return LogCumSumExp(), (torch.randn(2, length, 5),)
"""


def test_cli_report_names_the_stabilized_scan(capsys, tmp_path):
    from scanweaver_tvm import cli

    path = tmp_path / "lcse_models.py"
    path.write_text(LCSE_MODELS)
    code = cli.main(["report", f"{path}:lcse", "--length", "12", "-q"])
    out, _ = capsys.readouterr()
    assert code == 0, out
    (line,) = [line for line in out.splitlines() if line.strip().startswith("scan ")]
    for word in ("stabilized", "L=12", "batch=2", "channels=5", "decay=none", "den-only", "forward",
                 "torch.logcumsumexp"):
        assert word in line, line


def test_logcumsumexp_dynamic_length_compiles_once():
    """``dynamic_shapes``: traced at a few lengths, generalized to a symbolic L (the stabilized
    spec takes a named length); one executable for L = 1 .. 1025; it builds for CUDA too."""
    import tvm
    from tvm import relax

    model = LogCumSumExp(1)
    L = torch.export.Dim("L", min=2, max=4096)
    mod = sw.from_torch(model, (torch.randn(2, 16, 5),), dynamic_shapes=({1: L},))
    from scanweaver_core.scan_op import parse_scan
    specs = [parse_scan(b.value)[0] for blk in mod["main"].body.blocks for b in blk.bindings
             if parse_scan(b.value) is not None]
    assert len(specs) == 1 and specs[0].length == "L" and specs[0].is_symbolic
    vm = relax.VirtualMachine(sw.compile(mod, "llvm"), tvm.cpu())
    for n in (1, 3, 100, 1025):
        x = torch.randn(2, n, 5) * 50
        got = vm["main"](tvm.runtime.tensor(x.numpy()))
        got = got[0] if not hasattr(got, "numpy") else got
        np.testing.assert_allclose(got.numpy(), torch.logcumsumexp(x, dim=1).numpy(), rtol=1e-6, atol=1e-4)
    sw.compile(mod, {"kind": "cuda", "arch": "sm_90"})


class UnsortedTopK(nn.Module):
    """A router as MoE layers write it: ``topk(sorted=False)``, weights gathered by index and
    summed (order-free, as any correct reader of an unsorted topk is)."""

    def forward(self, x, w):
        scores, idx = torch.topk(x, 3, dim=-1, sorted=False)
        return (scores.softmax(-1)[..., None] * w[idx]).sum(-2)


def test_unsorted_topk_is_imported():
    args = (torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(0)),
            torch.randn(8, 4, generator=torch.Generator().manual_seed(1)))
    model = UnsortedTopK().eval()
    assert_outputs_match(run_model(sw.from_torch(model, args), list(args)), torch_outputs(model, args), rtol=1e-5)
