"""The public API: import a model, find its recurrences, compile it with ScanWeaver scans."""
import tvm
from tvm import relax

import tir_schedules
from tir_schedules import dense_cpu, gpu_rules
from relax_pass.fuse import FuseAffineRecurrences, analyze
from relax_pass.lower import LowerScans

__all__ = ["from_torch", "from_onnx", "find_recurrences", "FuseAffineRecurrences", "LowerScans",
           "pipeline", "compile"]


def from_torch(model, example_args, example_kwargs=None, dynamic_shapes=None, trace_sizes=None):
    """``torch.export`` + TVM's Relax frontend, parameters kept as constants: ``main`` takes
    exactly ``example_args``, in order, and returns what the model returns (as a tuple).

    ``dynamic_shapes`` (``torch.export``'s own spec, with named ``torch.export.Dim``s): the model
    is traced at a few small sizes of each dynamic dim (``trace_sizes``, name -> sizes,
    overrides them), the recurrences of each trace are fused, and the traces are generalized
    into one module whose dims are symbolic, named after the Dims (``scanweaver_tvm.dynamic``).
    It compiles once and runs at any size; what does not generalize raises
    ``generalize.GeneralizeError`` naming the node.

    ``example_kwargs`` are passed to the model as constants of the trace.  A Hugging Face model
    whose ``forward`` takes ``use_cache`` is traced with ``use_cache=False`` unless they say
    otherwise: its ``Cache`` object is not a tensor and cannot be an output.  Imports TVM 0.27
    gets wrong are repaired (``torch_repairs``).

    ``torch._higher_order_ops.scan`` with an affine combine function (one carry,
    ``h = a*h + b``) becomes a ScanWeaver scan (``torch_frontend``); any other combine function
    raises ``torch_frontend.UnsupportedScan`` (a ``ValueError``) naming the node and why."""
    import warnings

    import torch
    from tvm.relax.frontend.torch import from_exported_program

    from . import torch_frontend, torch_repairs

    _check_no_complex(model, example_args)
    kwargs = dict(example_kwargs or {})
    if _takes_use_cache(model) and "use_cache" not in kwargs:
        kwargs["use_cache"] = False
    if dynamic_shapes is not None:
        from . import dynamic

        return dynamic.import_generic(lambda args: from_torch(model, args, kwargs), FuseAffineRecurrences(),
                                      model, example_args, dynamic_shapes, trace_sizes)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)  # torch's own pytree notices
        traced = _with_constants(model, kwargs) if kwargs else model
        exported = torch.export.export(traced, tuple(example_args))
        mod = from_exported_program(exported, keep_params_as_input=False,
                                    custom_convert_map=torch_frontend.custom_convert_map())
    return torch_repairs.repair(mod)


def _with_constants(model, kwargs):
    """``model`` with ``kwargs`` bound: as constants of the trace, not inputs of the exported
    program (TVM's frontend takes only tensor inputs)."""
    import torch

    class Bound(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            return self.model(*args, **kwargs)

    return Bound()


def _takes_use_cache(model):
    """A Hugging Face model (it has a ``config``) whose ``forward`` has a ``use_cache`` argument."""
    import inspect

    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
    return hasattr(model, "config") and "use_cache" in params


def _check_no_complex(model, example_args):
    """TVM's torch frontend has no complex dtype and fails without naming the tensor: name it."""
    import inspect

    try:
        names = list(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        names = []
    for i, x in enumerate(example_args):
        if getattr(x, "is_complex", lambda: False)():
            name = f" ({names[i]})" if i < len(names) else ""
            raise ValueError(f"example_args[{i}]{name}: {x.dtype} tensor; TVM's Relax has no "
                             "complex dtype (pass real and imaginary parts separately)")
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if t.is_complex():
            raise ValueError(f"{type(model).__name__}.{name}: {t.dtype} tensor; TVM's Relax has "
                             "no complex dtype")


def from_onnx(model, trace_sizes=None):
    """TVM's Relax ONNX frontend plus our ``Scan``/``Loop`` converters, then FoldConstant.  A
    model with ``Scan``/``Loop`` and symbolic input dims keeps them: it is imported at a few sizes
    (``trace_sizes`` overrides them) and generalized (``onnx_frontend.from_onnx``)."""
    from . import onnx_frontend

    return onnx_frontend.from_onnx(model, trace_sizes)


def find_recurrences(mod, include_rejected=False, cumulative=False):
    """What ``FuseAffineRecurrences(cumulative)`` would rewrite in ``mod`` (``Recurrence``
    items); with ``include_rejected`` also the near misses it leaves alone (``.reason``)."""
    return [r for r in analyze(mod, cumulative) if include_rejected or not r.rejected]


def _target(target):
    return tir_schedules.resolve_target(target)


def _default_pipeline(target):
    """TVM's pipeline for ``target``; on LLVM targets with the dense layers scheduled
    (``tir_schedules.dense_cpu``: TVM's CPU pipeline leaves matmuls as naive loops), on CUDA
    with DLight's rules kept from symbolic-size scratch memory (``tir_schedules.gpu_rules``)."""
    if target.kind.name == "cuda":
        return gpu_rules.cuda_pipeline(target)     # (DLight rules guarded for symbolic shapes)
    if "gpu" in target.keys:
        return relax.get_default_pipeline(target)
    if target.kind.name == "llvm":
        return dense_cpu.cpu_pipeline(target)
    return relax.get_pipeline("default")


def pipeline(target, realization="tir", database=None):
    """Our passes for ``target``: FuseAffineRecurrences then LowerScans.  Put it in front of
    ``relax.get_default_pipeline(target)`` (``compile`` does exactly that).  ``database``:
    tuning records from ``tune`` (each tuned scan uses its best record)."""
    target = _target(target)
    return tvm.transform.Sequential([FuseAffineRecurrences(),
                                     LowerScans(target, realization, database=database)],
                                    name="scanweaver")


def compile(mod, target="llvm", realization="tir", database=None):  # noqa: A001 (mirrors tvm.compile)
    """Fuse recurrences, lower each scan with ``realization`` for ``target``, then TVM's default
    pipeline; returns an Executable for ``relax.VirtualMachine``.  ``"llvm"`` is the host CPU.
    ``database``: MetaSchedule records from ``tune``; scans without a record use the defaults."""
    target = _target(target)
    seq = tvm.transform.Sequential([pipeline(target, realization, database), _default_pipeline(target)])
    return tvm.compile(mod, target=target, relax_pipeline=seq)
