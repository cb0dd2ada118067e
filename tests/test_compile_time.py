"""Loops the pass leaves alone compile as fast as without it (``fuzz.check.compile_budget``):
nonlinear RNNs in the forms users write them, each equal to PyTorch.

Each once made ``sw.compile`` run for minutes: our CPU rules inlined every stage of the
unrolled loop into the last, a stage read two or three times by the next (``h * sigmoid(h)``;
``tanh``, which LLVM lowers to three uses of its argument), so the function grew as 3**steps.
The rules now leave such a function as ``tvm.compile`` leaves it (``cpu_rule.GROWTH``)."""
import pytest
import torch
import tvm
from tvm import relax

import scanweaver_tvm as sw

from harness import assert_outputs_match, compile_unfused_within_budget, torch_outputs


class TanhRNN(torch.nn.Module):
    """The plainest RNN: ``h = tanh(a_t * h + b_t)``."""

    def forward(self, a, b):
        h = torch.zeros_like(a[:, 0])
        hs = []
        for t in range(a.shape[1]):
            h = torch.tanh(a[:, t] * h + b[:, t])
            hs.append(h)
        return torch.stack(hs, 1)


class GatedLoop(torch.nn.Module):
    """A GRU-style step on an fp16 input upcast inside the loop; outputs stacked on axis 2."""

    def __init__(self, width):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(width))

    def forward(self, x):
        h = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32)
        hs = []
        for t in range(x.shape[2]):
            h = torch.tanh(x[:, :, t].float()) + h * (self.w * torch.sigmoid(h))
            hs.append(h)
        return torch.stack(hs, 2)


class CellLoop(torch.nn.Module):
    """``torch.nn.LSTMCell`` / ``GRUCell`` stepped over the sequence, as tutorials write it."""

    def __init__(self, cell, hidden):
        super().__init__()
        self.cell, self.hidden = cell, hidden

    def forward(self, x):
        h = x.new_zeros(x.shape[0], self.hidden)
        c = x.new_zeros(x.shape[0], self.hidden)
        outs = []
        for t in range(x.shape[1]):
            if isinstance(self.cell, torch.nn.LSTMCell):
                h, c = self.cell(x[:, t], (h, c))
            else:
                h = self.cell(x[:, t], h)
            outs.append(h)
        return torch.stack(outs, 1)


class MinGRUDecode(torch.nn.Module):
    """minGRU-pytorch's ``minGRU`` stepped token by token with its returned hidden state (its
    sequential mode: ``torch.lerp`` of the state)."""

    def __init__(self, dim):
        super().__init__()
        from minGRU_pytorch import minGRU

        self.cell = minGRU(dim)

    def forward(self, x):
        hidden, outs = None, []
        for t in range(x.shape[1]):
            out, hidden = self.cell(x[:, t:t + 1], hidden, return_next_prev_hidden=True)
            outs.append(out)
        return torch.cat(outs, 1)


def _case(name):
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    if name == "tanh_rnn":
        return TanhRNN(), (torch.randn(2, 24, 8, generator=g), torch.randn(2, 24, 8, generator=g))
    if name == "gated_fp16":
        return GatedLoop(8), (torch.randn(2, 8, 17, generator=g).half(),)
    if name == "lstm_cell":
        return CellLoop(torch.nn.LSTMCell(16, 32), 32), (torch.randn(2, 16, 16, generator=g),)
    if name == "gru_cell":
        return CellLoop(torch.nn.GRUCell(16, 32), 32), (torch.randn(2, 16, 16, generator=g),)
    return MinGRUDecode(64), (torch.randn(1, 64, 64, generator=g),)


@pytest.mark.parametrize("name", ["tanh_rnn", "gated_fp16", "lstm_cell", "gru_cell", "mingru_decode"])
def test_a_loop_left_alone_compiles_within_budget_and_matches(name):
    model, args = _case(name)
    model = model.eval()
    mod = sw.from_torch(model, args)
    ex = compile_unfused_within_budget(mod)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a.numpy()) for a in args])
    got = [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]
    assert_outputs_match(got, torch_outputs(model, args), rtol=1e-5)


def test_the_rnn_near_miss_is_reported():
    model, args = _case("tanh_rnn")
    recs = sw.find_recurrences(sw.from_torch(model, args), include_rejected=True)
    assert recs and all(r.rejected for r in recs)
    assert "relax.tanh" in recs[0].reason and "not affine in h" in recs[0].reason


@pytest.mark.parametrize("name", ["tanh_rnn", "gated_fp16"])
def test_the_functions_left_unscheduled_build_for_avx2(name):
    """What the rules leave alone is built as TVM builds it, also for an AVX2 target (where TVM
    0.27 fails on some unscheduled two-stage nests: ``test_elementwise_cpu``)."""
    model, args = _case(name)
    ex = sw.compile(sw.from_torch(model.eval(), args), {"kind": "llvm", "mcpu": "haswell"})
    assert ex is not None


def test_a_long_pass_is_reported_while_it_runs(caplog):
    """``compile_watch``: a pass that runs past the budget is named as it runs, with the
    module's largest function and the rule that scheduled it."""
    import time

    from tvm import te

    from scanweaver_tvm import compile_watch
    from tir_schedules.cpu_rule import RULE_ATTR

    a = te.placeholder((8,), name="A")
    func = te.create_prim_func([a, te.compute((8,), lambda i: a[i] * 2.0, name="B")])
    mod = tvm.IRModule({"double": func.with_attr(RULE_ATTR, "ElementwiseCPU")})

    @tvm.transform.module_pass(opt_level=0, name="test.SlowPass")
    def slow(m, _ctx):
        time.sleep(1.5)
        return m

    with caplog.at_level("WARNING", logger="scanweaver"), compile_watch.watch(budget_s=0.5):
        slow(mod)
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "test.SlowPass has run" in text
    assert "double (" in text and "scheduled by ElementwiseCPU" in text
    caplog.clear()
    with caplog.at_level("WARNING", logger="scanweaver"), compile_watch.watch(budget_s=5):
        slow(mod)
    assert not caplog.records


def test_the_rule_that_scheduled_a_function_is_on_it():
    """``cpu_rule.ApplyRules`` keeps the rule's name on each function it scheduled."""
    model, args = _case("lstm_cell")
    from scanweaver_tvm import api
    from tir_schedules import dense_cpu
    from tir_schedules.cpu_rule import RULE_ATTR

    target = api._target("llvm")
    mod = api._legalize_and_fold_at_once(target)(api.passes(target)(sw.from_torch(model.eval(), args)))
    with target:
        mod = tvm.transform.Sequential(dense_cpu.tunable_passes(target) + dense_cpu.schedule_passes())(mod)
    rules = {str(f.attrs[RULE_ATTR]) for _, f in mod.functions_items()
             if isinstance(f, tvm.tirx.PrimFunc) and f.attrs and RULE_ATTR in f.attrs}
    assert {"DenseCPU", "ElementwiseCPU"} <= rules
