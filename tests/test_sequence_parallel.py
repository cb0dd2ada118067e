"""Sequence-parallel scans (``scanweaver_tvm.sequence_parallel``), every scan family, run
phase-serially in one process: each rank's ``summarize``, the gathered summaries, each rank's
``finish``, against the float64 oracle on the whole sequence (1e-5 of its scale, float32).
The parts cut the sequence unevenly (L = 41 over 2, 3, 4 ranks), across the chunked kernels'
chunks, with and without initial states, both directions.  The same modules over real gloo
ranks: ``test_sequence_parallel_ranks.py``."""
import dataclasses

import numpy as np
import pytest
import tvm

from scanweaver_core import reference
from scanweaver_core.spec import (AffineScanSpec, DeltaScanSpec, MatrixScanSpec, MLSTMScanSpec, SelectiveScanSpec,
                                  StabilizedScanSpec)
from scanweaver_core import sequence_parts as sp_parts
from scanweaver_core.sequence_parts import output_time_axis
from scanweaver_tvm import sequence_parallel as sp
from tests.harness import TOL
from scanweaver_tvm.sequence_parallel import cost
from tests import test_delta_rule, test_dplr_rule, test_matrix_cpu, test_mlstm, test_selective, test_stabilized_cpu

L = 41       # parts of 10 to 21 steps: they cut the matrix kernels' 16-step chunks
RANKS = (1, 2, 3, 4)


def _affine(spec, rng):
    a = rng.uniform(0.3, 1.0, tuple(L if n == "L" else n for n in spec.a_shape)).astype(np.float32)
    x = {"a": a, "b": rng.standard_normal(spec.shape).astype(np.float32)}
    if spec.has_h0:
        x["h0"] = rng.standard_normal(spec.state_shape).astype(np.float32)
    return x


def _selective(spec, rng):
    return {n: v for n, v in test_selective.operands(spec, rng).items() if v is not None}


CASES = {   # name: (spec, operands(spec, rng))
    "affine_h0": (AffineScanSpec.create((2, L, 4), (1, L, 4), axis=1, has_h0=True, outputs=("states", "last")),
                  _affine),
    "affine_reverse_last_only": (AffineScanSpec.create((3, L), (3, L), axis=1, reverse=True, outputs=("last",)),
                                 _affine),
    "selective_mamba": (SelectiveScanSpec(2, 6, L, 4, has_D=True, has_z=True, has_delta_bias=True,
                                          delta_softplus=True, has_h0=True, return_last_state=True), _selective),
    "matrix_none": (MatrixScanSpec.create(2, 2, L, 4, 3, return_last_state=True), test_matrix_cpu.operands),
    "matrix_scalar_gamma": (MatrixScanSpec.create(1, 2, L, 4, 3, decay="scalar", g_shape=(1, 2, 1, 1),
                                                  has_h0=True, reverse=True, return_last_state=True),
                            test_matrix_cpu.operands),
    "matrix_key_gla": (MatrixScanSpec.create(2, 2, L, 4, 3, decay="key", return_last_state=True),
                       test_matrix_cpu.operands),
    "matrix_selective_channel_major": (MatrixScanSpec.create(
        1, 2, L, 4, 3, decay="selective", layout="channel_major", has_dt_bias=True, dt_softplus=True,
        has_skip=True, has_gate=True, return_last_state=True), test_matrix_cpu.operands),
    "stabilized_rwkv4": (StabilizedScanSpec(2, 5, L, decay="channel", has_bonus=True, return_last_state=True),
                         test_stabilized_cpu.operands),
    "stabilized_step_h0_reverse": (StabilizedScanSpec(2, 5, L, decay="step", has_h0=True, reverse=True,
                                                      layout="channel_major", return_last_state=True),
                                   test_stabilized_cpu.operands),
    "stabilized_logcumsumexp": (StabilizedScanSpec(1, 3, L, decay="none", has_values=False),
                                test_stabilized_cpu.operands),
    "mlstm": (MLSTMScanSpec(2, 2, L, 4, 3, return_last_state=True), test_mlstm.operands),
    "mlstm_h0_reverse": (MLSTMScanSpec(1, 2, L, 4, 3, has_h0=True, reverse=True, return_last_state=True),
                         test_mlstm.operands),
    "delta_gated_grouped": (DeltaScanSpec(1, 4, L, 4, 3, decay="head", qk_heads=2, scale=0.5, l2norm=True,
                                          return_last_state=True), test_delta_rule.operands),
    "delta_kda_h0": (DeltaScanSpec(2, 2, L, 4, 5, decay="key", has_h0=True, return_last_state=True),
                     test_delta_rule.operands),
    "delta_comba_reverse": (DeltaScanSpec(1, 2, L, 4, 3, separate_read=True, reverse=True,
                                          return_last_state=True), test_delta_rule.operands),
    "delta_bf16": (DeltaScanSpec(1, 2, L, 4, 3, decay="head", l2norm=True, dtype="bfloat16", return_last_state=True),
                   test_delta_rule.operands),
    "dplr_rwkv7": (DeltaScanSpec(1, 2, L, 4, 3, decay="key", rule="dplr", has_h0=True, return_last_state=True),
                   test_dplr_rule.operands),
}


def oracle(spec, x):
    """``{output name: float64 array}`` of the whole sequence."""
    f = {n: v.astype(np.float64) for n, v in x.items()}
    if isinstance(spec, AffineScanSpec):
        states = reference.affine_scan(f["a"], f["b"], f.get("h0"), spec.axis, spec.reverse)
        return {"states": states, "last": reference.last_state(states, spec.axis, spec.reverse)}
    if isinstance(spec, SelectiveScanSpec):
        out, last = reference.selective_scan(**{n: f.get(n) for n in ("u", "delta", "A", "B", "C", "D", "z",
                                                                       "delta_bias", "h0")},
                                             delta_softplus=spec.delta_softplus, return_last_state=True)
        return {"out": out, "last_state": last}
    if isinstance(spec, MatrixScanSpec):
        o, last = reference.matrix_scan(f["q"], f["k"], f["v"], f.get("g", f.get("dt")), spec.decay, f.get("h0"),
                                        spec.reverse, True, A=f.get("A"), dt_bias=f.get("dt_bias"),
                                        dt_softplus=spec.dt_softplus, D=f.get("D"), z=f.get("z"), layout=spec.layout)
        return {"o": o, "last": last}
    full = dataclasses.replace(spec, return_last_state=True)
    h0 = [f[n] for n in spec.operand_names() if n.endswith("0")] if spec.has_h0 else None
    if isinstance(spec, StabilizedScanSpec):
        out, state = reference.stabilized_scan(f["k"], f.get("v"), f.get("w"), f.get("u"), h0, spec.reverse, True,
                                               spec.layout, method="loop")
    elif isinstance(spec, MLSTMScanSpec):
        out, state = reference.mlstm_scan(*(f[n] for n in "qkvif"), h0, spec.normalized, spec.eps, spec.reverse,
                                          True)
    elif spec.is_dplr:
        out, state = reference.dplr_scan(f["q"], f["k"], f["v"], f["a"], f["b"], f.get("g"), f.get("S0"),
                                         spec.scale, spec.reverse, True)
    else:
        out, state = reference.delta_scan(f["q"], f["k"], f["v"], f["beta"], f.get("g"), f.get("p"), f.get("S0"),
                                          spec.scale, spec.l2norm, spec.reverse, True)
    state = state if isinstance(state, (tuple, list)) else [state]
    return dict(zip(full.output_names(), [out, *state]))


def compile_for_rank_counts(spec, counts):
    """One VM holding ``summarize`` (the same for any count) and each count's ``finish`` as
    ``finish_<count>``: the functions ``sp.build`` makes, one compile for all."""
    from scanweaver_tvm import api
    from scanweaver_tvm.sequence_parallel import collective  # noqa: F401 (the extern main calls)

    funcs = {"summarize": sp.build(spec, counts[0])["summarize"]}
    for count in counts:
        funcs[f"finish_{count}"] = sp.build(spec, count)["finish"].with_attr("global_symbol", f"finish_{count}")
    return tvm.relax.VirtualMachine(api.compile(tvm.IRModule(funcs), "llvm"), tvm.cpu())


def run_serially(vm, spec, operands, ranks, finish="finish"):
    """Every rank's outputs (``{name: array}``), the ranks run one phase at a time: all
    ``summarize``, the summaries concatenated as the all-gather does, all ``finish``."""
    parts = sp.split_operands(spec, operands, ranks)
    view = sp.view(spec)
    h0 = [name for name, *_ in view.states]

    def tensor(x):
        return tvm.runtime.tensor(np.array(x, order="C"))

    packed = [vm["summarize"](*[tensor(p[n]) for n in view.operands if n not in h0]).numpy() for p in parts]
    assert {x.size for x in packed} == {sp.layout(spec).elements}
    gathered = np.concatenate(packed)
    outs = []
    for rank, part in enumerate(parts):
        got = vm[finish](*[tensor(part[n]) for n in view.operands], tensor(gathered), tensor(np.int64(rank)))
        got = [got] if hasattr(got, "numpy") else list(got)
        outs.append(dict(zip(view.outputs, (g.numpy() for g in got))))
    return outs


def assert_matches_whole(spec, outs, want, rtol=1e-5):
    """Each rank's per-step output is its slice of the whole; each holds the whole's last
    state; both within ``rtol`` of the output's scale."""
    assert set(outs[0]) == set(sp.view(spec).outputs)
    for name in outs[0]:
        axis = output_time_axis(spec, name)
        if axis is not None:
            got = np.concatenate([o[name] for o in outs], axis=axis)
        else:
            got = outs[-1][name]
            for o in outs:
                np.testing.assert_array_equal(o[name], got, err_msg=f"{name}: the ranks disagree")
        err = np.abs(got.astype(np.float64) - want[name]).max() / max(np.abs(want[name]).max(), 1.0)
        assert err <= rtol, f"{name}: {err:.2e} of its scale"


def draw(case):
    spec, make = CASES[case]
    operands = make(spec, np.random.default_rng(len(case)))
    return spec, {n: v for n, v in operands.items() if n in sp.view(spec).operands}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_rank_count_equals_the_whole_sequence(case):
    spec, operands = draw(case)
    want = oracle(spec, operands)
    vm = compile_for_rank_counts(spec, RANKS)
    rtol = 1e-5 if spec.dtype == "float32" else TOL[spec.dtype]
    for ranks in RANKS:
        assert_matches_whole(spec, run_serially(vm, spec, operands, ranks, f"finish_{ranks}"), want, rtol)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_summary_is_the_cost_models_size(case):
    """What a rank packs for the all-gather is ``cost.summary_bytes`` (written apart from it)."""
    spec, _ = CASES[case]
    assert 4 * sp.layout(spec).elements == cost.summary_bytes(spec)


@pytest.mark.parametrize("case", ["matrix_key_gla", "delta_kda_h0", "mlstm_h0_reverse", "stabilized_rwkv4"])
def test_parts_of_one_step(case):
    """As many ranks as steps (L = 5 over 5 ranks): every part is one step."""
    spec, make = CASES[case]
    spec = sp_parts.with_length(spec, 5)
    operands = {n: v for n, v in make(spec, np.random.default_rng(5)).items() if n in sp.view(spec).operands}
    vm = compile_for_rank_counts(spec, (5,))
    assert_matches_whole(spec, run_serially(vm, spec, operands, 5, "finish_5"), oracle(spec, operands))
