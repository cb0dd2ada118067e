"""The tuning tasks of the dataset and the evaluation, rebuilt from what the dataset stores.

Two kinds of task:

- a **family** and its parameters: TVM's standard workloads and LLM-shaped kernels made here
  (matmul, depthwise causal conv1d, RMSNorm, LayerNorm, softmax), and ScanWeaver scan specs
  (their canonical workload from ``tir_schedules.search``);
- a **kernel of a model**: a fused PrimFunc ``sw.tune`` extracts from a whole model
  (``scanweaver_tvm.tuning.model_tasks``), stored as its TVMScript (``"script"``), which
  parses back to the same function (structurally equal).

``task_module(task)`` rebuilds either from a dataset entry.
"""
import json

import tvm
from tvm import te, tirx, topi
from tvm.s_tir.meta_schedule.testing import te_workload

STANDARD = ("matmul", "conv2d", "conv1d_dw", "softmax", "layernorm", "rmsnorm")
SCAN = ("scan_affine", "scan_selective")
MODEL = "model"      # a model's kernel, kept as TVMScript


def _layernorm(m, n):
    data = te.placeholder((m, n), name="X")
    gamma = te.placeholder((n,), name="gamma")
    beta = te.placeholder((n,), name="beta")
    return data, gamma, beta, topi.nn.layer_norm(data, gamma, beta, axis=[1])


def _rmsnorm(m, n, eps=1e-5):
    data = te.placeholder((m, n), name="X")
    weight = te.placeholder((n,), name="weight")
    k = te.reduce_axis((0, n), name="k")
    square_sum = te.compute((m,), lambda i: te.sum(data[i, k] * data[i, k], axis=k), name="square_sum")
    out = te.compute((m, n), lambda i, j: data[i, j] * tirx.rsqrt(square_sum[i] / n + eps) * weight[j],
                     name="rmsnorm")
    return data, weight, out


def _conv1d_depthwise_causal(batch, channels, length, kernel):
    """Mamba's short convolution: ``out[b, c, t] = sum_k w[c, k] * x[b, c, t + k]`` over the
    input padded by ``kernel - 1`` steps on the left."""
    data = te.placeholder((batch, channels, length), name="X")
    weight = te.placeholder((channels, kernel), name="W")
    padded = te.compute((batch, channels, length + kernel - 1),
                        lambda b, c, t: tirx.if_then_else(t >= kernel - 1, data[b, c, t - (kernel - 1)],
                                                          tirx.const(0.0, "float32")), name="pad")
    k = te.reduce_axis((0, kernel), name="k")
    out = te.compute((batch, channels, length),
                     lambda b, c, t: te.sum(padded[b, c, t + k] * weight[c, k], axis=k), name="conv1d")
    return data, weight, out


def _scan_spec(family, params):
    from scanweaver_core.spec import AffineScanSpec, SelectiveScanSpec
    if family == "scan_affine":
        return AffineScanSpec.create(tuple(params["shape"]), axis=params.get("axis", -1))
    return SelectiveScanSpec(**params)


_TE = {"matmul": lambda p: te_workload.matmul(*p), "conv2d": lambda p: te_workload.conv2d_nhwc(*p),
       "softmax": lambda p: te_workload.softmax_mn(*p), "layernorm": lambda p: _layernorm(*p),
       "rmsnorm": lambda p: _rmsnorm(*p), "conv1d_dw": lambda p: _conv1d_depthwise_causal(*p)}


def build(family, params):
    """The initial (unscheduled) PrimFunc ``main`` of a family's task.  ``matmul`` params are
    ``[M, N, K]`` (``A[M, K] @ B[K, N]``)."""
    if family in _TE:
        return te.create_prim_func(_TE[family](params)).with_attr("global_symbol", "main")
    if family in SCAN:
        from tir_schedules.search import scan_workload
        return scan_workload(_scan_spec(family, params))
    raise ValueError(f"task family {family!r}: expected one of {STANDARD + SCAN}")


def spec_of(family, params):
    """The scan spec of a scan task (``tir_schedules.search.tune_task`` takes specs)."""
    if family not in SCAN:
        raise ValueError(f"task family {family!r} is not a scan")
    return _scan_spec(family, params)


def task_name(family, params):
    return f"{family}:{json.dumps(params, separators=(',', ':'), sort_keys=True)}"


def module(family, params):
    return tvm.IRModule({"main": build(family, params)})


def from_script(script):
    """A model kernel's module from its stored TVMScript."""
    func = tvm.script.from_source(script)
    if not isinstance(func, tirx.PrimFunc):
        raise ValueError("model task: the stored script is not one PrimFunc")
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def task_module(task):
    """The initial module of a dataset task (``{"family", "params"[, "script"]}``)."""
    if task.get("script"):
        return from_script(task["script"])
    return module(task["family"], task["params"])
