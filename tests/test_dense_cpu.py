"""The CPU dense-layer rule (``tir_schedules.dense_cpu``): what it schedules, and that the
scheduled layers compute what PyTorch does, at ragged sizes, batched, with epilogues."""
import pytest
import torch
import tvm
from tvm import relax

import scanweaver_tvm as sw
from scanweaver_core.targets import host_target
from tir_schedules import dense_cpu
from tvm.relax.backend.cpu_generic import pipeline as cpu

from harness import assert_outputs_match, run_model, torch_outputs


class Dense(torch.nn.Module):
    def __init__(self, k, n, bias=True, act=None):
        super().__init__()
        self.lin = torch.nn.Linear(k, n, bias=bias)
        self.act = act

    def forward(self, x):
        y = self.lin(x)
        return self.act(y) if self.act is not None else y


class Bmm(torch.nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b) + a.sum(-1, keepdim=True)


def scheduled(mod):
    """``mod`` legalized and fused as TVM's CPU pipeline does, then our schedule passes."""
    target = host_target()
    with target:
        return tvm.transform.Sequential(cpu.legalize_passes(target) + dense_cpu.schedule_passes())(mod)


def matmul_funcs(mod):
    return [f.script() for _, f in mod.functions_items()
            if not isinstance(f, relax.Function) and "matmul" in f.script()]


@pytest.mark.parametrize("m,k,n", [(1, 8, 40), (7, 33, 96), (16, 64, 80), (3, 5, 7), (9, 48, 1000)])
@pytest.mark.parametrize("act", [None, torch.nn.functional.silu], ids=["plain", "silu"])
def test_linear_layers_match_pytorch(m, k, n, act):
    torch.manual_seed(m * n + k)
    model = Dense(k, n, act=act).eval()
    x = torch.randn(2, m, k)
    mod = sw.from_torch(model, [x])
    funcs = matmul_funcs(scheduled(mod))
    assert funcs and all("T.parallel" in f and "T.vectorized" in f for f in funcs), funcs
    assert_outputs_match(run_model(mod, [x]), torch_outputs(model, [x]), rtol=1e-5)


def test_constant_weight_is_packed_once_at_compile_time():
    model = Dense(64, 80, bias=False).eval()
    mod = scheduled(sw.from_torch(model, [torch.randn(1, 5, 64)]))
    consts, callees = [], []

    def visit(e):
        if isinstance(e, tvm.ir.GenericConst):
            consts.append(tuple(e.value.shape))
        if isinstance(e, relax.Call) and isinstance(e.args[0] if e.args else None, tvm.ir.GlobalVar):
            callees.append(e.args[0].name_hint)

    relax.analysis.post_order_visit(mod["main"], visit)
    # the weight reaches the matmul as (N / NR, K, NR) panels, N = 80 padded to 96
    assert (96 // dense_cpu.NR, 64, dense_cpu.NR) in consts, consts
    assert not [c for c in callees if "prepack" in c and "prepacked" not in c], callees   # folded


def test_matmul_of_two_activations_matches_pytorch():
    a, b = torch.randn(3, 5, 6), torch.randn(3, 6, 37)
    mod = sw.from_torch(Bmm(), [a, b])
    assert matmul_funcs(scheduled(mod))
    assert_outputs_match(run_model(mod, [a, b]), torch_outputs(Bmm(), [a, b]), rtol=1e-5)


def test_non_matmul_reductions_are_left_alone():
    class Norm(torch.nn.Module):
        def forward(self, x):
            return x / x.pow(2).sum(-1, keepdim=True).sqrt()

    x = torch.randn(4, 33)
    mod = sw.from_torch(Norm(), [x])
    assert all("T.parallel" not in f.script() for _, f in scheduled(mod).functions_items()
               if not isinstance(f, relax.Function))
    assert_outputs_match(run_model(mod, [x]), torch_outputs(Norm(), [x]), rtol=1e-5)
