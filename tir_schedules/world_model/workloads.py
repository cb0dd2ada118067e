"""The tuning tasks of the dataset and the evaluation, rebuilt from ``(family, params)``.

Standard TVM workloads at small shapes (one CPU trial well under a second) and ScanWeaver scan
specs (their canonical workload from ``tir_schedules.search``).  A task is named by its family
and parameters, which is all the dataset stores to rebuild its initial program.
"""
import json

import tvm
from tvm import te, topi
from tvm.s_tir.meta_schedule.testing import te_workload

STANDARD = ("matmul", "conv2d", "softmax", "layernorm")
SCAN = ("scan_affine", "scan_selective")


def _layernorm(m, n):
    data = te.placeholder((m, n), name="X")
    gamma = te.placeholder((n,), name="gamma")
    beta = te.placeholder((n,), name="beta")
    return data, gamma, beta, topi.nn.layer_norm(data, gamma, beta, axis=[1])


def _scan_spec(family, params):
    from scanweaver_core.spec import AffineScanSpec, SelectiveScanSpec
    if family == "scan_affine":
        return AffineScanSpec.create(tuple(params["shape"]), axis=params.get("axis", -1))
    return SelectiveScanSpec(**params)


def build(family, params):
    """The initial (unscheduled) PrimFunc ``main`` of a task."""
    if family == "matmul":
        func = te.create_prim_func(te_workload.matmul(*params))
    elif family == "conv2d":
        func = te.create_prim_func(te_workload.conv2d_nhwc(*params))
    elif family == "softmax":
        func = te.create_prim_func(te_workload.softmax_mn(*params))
    elif family == "layernorm":
        func = te.create_prim_func(_layernorm(*params))
    elif family in SCAN:
        from tir_schedules.search import scan_workload
        return scan_workload(_scan_spec(family, params))
    else:
        raise ValueError(f"task family {family!r}: expected one of {STANDARD + SCAN}")
    return func.with_attr("global_symbol", "main")


def spec_of(family, params):
    """The scan spec of a scan task (``tir_schedules.search.tune_task`` takes specs)."""
    if family not in SCAN:
        raise ValueError(f"task family {family!r} is not a scan")
    return _scan_spec(family, params)


def task_name(family, params):
    return f"{family}:{json.dumps(params, separators=(',', ':'), sort_keys=True)}"


def module(family, params):
    return tvm.IRModule({"main": build(family, params)})
