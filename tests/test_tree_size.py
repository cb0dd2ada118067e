"""``tir_schedules.tree_size`` and the bound every CPU rule keeps (``cpu_rule.GROWTH``): a
function whose stages, inlined, would be written out exponentially larger is left unscheduled."""
import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import te, tirx
from tvm.s_tir import dlight as dl

from tir_schedules import cpu_rule
from tir_schedules.dense_cpu import DenseCPU
from tir_schedules.elementwise_cpu import ElementwiseCPU
from tir_schedules.short_reduction_cpu import ShortReductionCPU
from tir_schedules.tree_size import inlined_size, tree_size

HOST = tvm.target.Target("llvm")


def chain(stages, reads, tail=None):
    """``stages`` elementwise stages over (8, 64) floats, each reading the one before ``reads``
    times (``x * x / 2 + 1/4`` or ``x + 1``), as one PrimFunc with intermediate buffers (what
    FuseOps + FuseTIR make of an unrolled loop); ``tail`` ends it with what each rule takes: a
    matmul (``dense``), 4 taps along rows (``taps``) or a row sum and its scaling (``sum``)."""
    def step(prev):          # (te.compute takes no default arguments: a closure per stage)
        return lambda i, j: prev[i, j] * prev[i, j] * 0.5 + 0.25 if reads == 2 else prev[i, j] + 1.0

    a = te.placeholder((8, 64), name="A")
    x = a
    for n in range(stages):
        x = te.compute((8, 64), step(x), name=f"s{n}")
    if tail == "dense":
        w, k = te.placeholder((64, 32), name="W"), te.reduce_axis((0, 64), name="k")
        return te.create_prim_func([a, w, te.compute((8, 32), lambda i, j: te.sum(x[i, k] * w[k, j], axis=k))])
    if tail == "taps":
        r = te.reduce_axis((0, 4), name="r")
        return te.create_prim_func([a, te.compute((8, 61), lambda i, j: te.sum(x[i, j + r], axis=r))])
    if tail == "sum":        # (with an epilogue, as a norm has: DLight's rule wants one)
        k = te.reduce_axis((0, 64), name="k")
        total = te.compute((8,), lambda i: te.sum(x[i, k], axis=k), name="total")
        return te.create_prim_func([a, te.compute((8,), lambda i: total[i] * 0.5)])
    return te.create_prim_func([a, x])


def _reference(stages, reads, a):
    for _ in range(stages):
        a = a * a * 0.5 + 0.25 if reads == 2 else a + 1.0
    return a


def test_tree_size_counts_shared_subexpressions_once_per_use():
    x = tirx.Var("x", "float32")
    e = x
    for _ in range(40):
        e = e * e                                   # 40 nodes in memory, 2**41 - 1 as a tree
    assert tree_size(e) == 2 ** 41 - 1
    assert tree_size(tvm.tirx.op.tanh(x)) == 1 + 3       # LLVM lowers tanh to three uses of x


@pytest.mark.parametrize("reads", [1, 2])
def test_inlined_size_predicts_the_growth(reads):
    small, large = inlined_size(chain(8, reads)), inlined_size(chain(16, reads))
    if reads == 1:
        assert large < 2 * small                    # linear in the stages
    else:
        assert large > 2 ** 7 * small               # doubling with each stage


RULES = {"dense": DenseCPU(), None: ElementwiseCPU(), "taps": ShortReductionCPU(),
         "sum": cpu_rule.Guarded(dl.cpu.Reduction())}


@pytest.mark.parametrize("tail", list(RULES))
def test_every_rule_leaves_an_exponential_function_as_it_was(tail):
    """Each rule takes the function with 4 stages (it is bounded), none with 16."""
    assert RULES[tail].apply(chain(4, 2, tail), HOST, False) is not None
    before = chain(16, 2, tail)
    assert inlined_size(before) > 2 ** 16
    assert RULES[tail].apply(before, HOST, False) is None


def test_the_pipeline_leaves_it_unchanged_and_it_computes():
    """Before/Expected: the rules' pass on the 16-stage chain is the identity; built, it computes
    the chain (as TVM's own lowering of the unscheduled stages does)."""
    before = tvm.IRModule({"main": chain(16, reads=2)})
    with HOST:
        after = dl.ApplyDefaultSchedule(DenseCPU(), ElementwiseCPU(), ShortReductionCPU())(before)
    expected = tvm.IRModule({"main": chain(16, reads=2)})     # (the pass updates its input)
    assert tvm_ffi.structural_equal(after, expected)
    a = np.random.default_rng(0).uniform(0, 1, (8, 64)).astype("float32")
    out = tvm.runtime.tensor(np.zeros((8, 64), "float32"))
    tvm.compile(after, target=HOST)["main"](tvm.runtime.tensor(a), out)
    np.testing.assert_allclose(out.numpy(), _reference(16, 2, a), rtol=1e-6)


@pytest.mark.parametrize("stages,reads", [(8, 2), (16, 1)])
def test_a_bounded_chain_is_still_scheduled_into_one_stage(stages, reads):
    func = chain(stages, reads)
    sch = ElementwiseCPU().apply(func, HOST, False)
    assert sch is not None
    text = sch.mod["main"].script()
    assert text.count("T.sblock(") - text.count('T.sblock("root")') == 1
    a = np.random.default_rng(1).uniform(0, 1, (8, 64)).astype("float32")
    out = tvm.runtime.tensor(np.zeros((8, 64), "float32"))
    tvm.compile(sch.mod, target=HOST)["main"](tvm.runtime.tensor(a), out)
    np.testing.assert_allclose(out.numpy(), _reference(stages, reads, a), rtol=1e-6)


def test_a_function_of_more_stages_than_the_rules_inline_is_left_as_it_was(caplog):
    """A linear chain (no growth) of ``MAX_STAGES`` stages is scheduled; one stage more is left
    to TVM, said on logger ``scanweaver`` (inlining n stages costs TVM ~n**2: an unrolled loop
    FuseOps put in one function)."""
    assert ElementwiseCPU().apply(chain(cpu_rule.MAX_STAGES + 1, 1), HOST, False) is not None
    with caplog.at_level("INFO", logger="scanweaver"):
        assert ElementwiseCPU().apply(chain(cpu_rule.MAX_STAGES + 2, 1), HOST, False) is None
    assert f"{cpu_rule.MAX_STAGES + 1} stages" in caplog.text
