"""The public API: import a model, find its recurrences, compile it with ScanWeaver scans."""
import contextlib

import tvm
from tvm import relax

import tir_schedules
from tir_schedules import dense_cpu, fold_constants, gpu_rules, widen
from relax_pass.fuse import FuseAffineRecurrences, analyze
from relax_pass.in_place import InPlaceStates
from relax_pass.lower import LowerScans
from relax_pass.quantize_weights import QuantizeWeights

from . import compile_watch

__all__ = ["from_torch", "from_onnx", "find_recurrences", "FuseAffineRecurrences", "LowerScans",
           "passes", "pipeline", "compile"]


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
    with torch.no_grad(), warnings.catch_warnings(), _exportable_experts(model), \
            torch_repairs.aligned_constants(), torch_repairs.torch_dtypes(), \
            torch.backends.opt_einsum.flags(enabled=False):   # (einsums exported as written)
        warnings.filterwarnings("ignore", category=FutureWarning)  # torch's own pytree notices
        traced = _with_constants(model, kwargs) if kwargs or hasattr(model, "config") else model
        try:
            exported = torch.export.export(traced, tuple(example_args))
        except Exception as err:  # pylint: disable=broad-except (torch raises many kinds)
            raise ImportRefused(f"{type(model).__name__}: torch.export cannot trace its forward "
                                f"({type(err).__name__}: {_first_line(err)}){_model_line(err)}. That is a "
                                "limit of torch.export on this code (control flow or shapes that depend on "
                                "values, say), before ScanWeaver sees it") from err
        try:
            mod = from_exported_program(exported, keep_params_as_input=False,
                                        custom_convert_map=torch_frontend.custom_convert_map())
        except AssertionError as err:
            if "Unsupported function types" not in str(err):
                raise
            raise ImportRefused(f"{type(model).__name__}: TVM 0.27's PyTorch frontend has no converter for "
                                f"{str(err).split('types', 1)[1].strip()} (torch ops in its exported graph)") from err
    return torch_repairs.repair(mod)


class ImportRefused(ValueError):
    """A model ``from_torch`` cannot import, with the reason and, where known, the model's line."""


def _first_line(err):
    return (str(err).strip().splitlines() or [""])[0]


def _model_line(err):
    """`` at FILE:LINE `code` ``: the last frame of ``err``'s traceback outside torch and this
    package (the model's own code), or ``""``."""
    import os
    import traceback

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ours = tuple(os.path.join(root, p) + os.sep for p in ("scanweaver_tvm", "scanweaver_core", "relax_pass"))
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if f"{os.sep}torch{os.sep}" not in f.filename and not f.filename.startswith(ours)
              and "<" not in f.filename]
    if not frames:
        return ""
    f = frames[-1]
    return f" at {f.filename}:{f.lineno} `{(f.line or '').strip()}`"


@contextlib.contextmanager
def _exportable_experts(model):
    """Hugging Face MoE layers traced with ``experts_implementation="batched_mm"``: their
    default ``grouped_mm`` exports as ``histc`` and a custom ``grouped_mm_fallback`` op that TVM's
    frontend has no converter for (MiniMax, Qwen3-Next, Kimi Linear, ...).  ``batched_mm``
    computes the same experts from gathered weights; the user's setting is restored after."""
    switched = []
    for m in model.modules():
        config = getattr(m, "config", None)
        if hasattr(m, "set_experts_implementation") and \
                getattr(config, "_experts_implementation", None) == "grouped_mm":
            m.set_experts_implementation("batched_mm")
            switched.append(m)
    try:
        yield
    finally:
        for m in switched:
            m.set_experts_implementation("grouped_mm")


def _with_constants(model, kwargs):
    """``model`` with ``kwargs`` bound: as constants of the trace, not inputs of the exported
    program (TVM's frontend takes only tensor inputs).  A transformers ``ModelOutput`` comes
    back as its tuple (the same tensors in the same order as its pytree flattening):
    ``torch.export`` found a ``RwkvCausalLMOutput`` "not a known type" in one full-suite run,
    after other tests in the same process, so the trace does not rely on that registration."""
    import torch

    class Bound(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            out = self.model(*args, **kwargs)
            return out.to_tuple() if hasattr(out, "to_tuple") else out

    return Bound()


def _takes_use_cache(model):
    """A Hugging Face model (it has a ``config``) whose ``forward`` has a ``use_cache`` argument,
    or takes ``**kwargs`` and has ``config.use_cache`` (GraniteMoeHybrid passes it down)."""
    import inspect

    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
    takes = "use_cache" in params or (                 # or passes it on through **kwargs
        any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        and hasattr(getattr(model, "config", None), "use_cache"))
    return hasattr(model, "config") and takes


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


def _default_pipeline(target, database=None):
    """TVM's pipeline for ``target``; on LLVM targets with the dense layers scheduled
    (``tir_schedules.dense_cpu``: TVM's CPU pipeline leaves matmuls as naive loops), on CUDA
    with DLight's rules kept from symbolic-size scratch memory (``tir_schedules.gpu_rules``)."""
    if target.kind.name == "cuda":
        return gpu_rules.cuda_pipeline(target)     # (DLight rules guarded for symbolic shapes)
    if "gpu" in target.keys:
        return relax.get_default_pipeline(target)
    if target.kind.name == "llvm":
        return dense_cpu.cpu_pipeline(target, after_lowering=[InPlaceStates], database=database)
    return relax.get_pipeline("default")


def passes(target, realization="tir", database=None):
    """Our two passes for ``target``, FuseAffineRecurrences then LowerScans: the scans fused and
    realized, the rest of the module left as it is.  For composing a pipeline of your own; put
    in front of ``relax.get_default_pipeline(target)`` the module computes the same as
    ``compile``'s, but runs slower: on a CPU TVM's pipeline leaves the dense layers as naive
    loops (``pipeline`` keeps our rules).  ``database``: tuning records from ``tune``."""
    target = _target(target)
    return tvm.transform.Sequential([FuseAffineRecurrences(),
                                     LowerScans(target, realization, database=database)],
                                    name="scanweaver")


def pipeline(target, realization="tir", database=None, weights=None):
    """The whole Relax pipeline ``compile`` runs for ``target``, so that
    ``tvm.compile(mod, target, relax_pipeline=pipeline(target))`` is ``compile(mod, target)``:
    ``passes``, the weights quantized where ``weights`` names a format, on LLVM the legalized
    constants folded at once, then TVM's default pipeline with our rules (``_default_pipeline``:
    dense layers scheduled, states updated in place).  Use it in place of
    ``relax.get_default_pipeline(target)``, not in front of it.  The arguments are
    ``compile``'s."""
    target = _target(target)
    seq = [passes(target, realization, database)]
    if weights is not None:
        seq.append(QuantizeWeights(weights, target))
    if target.kind.name == "llvm":
        seq.append(_legalize_and_fold_at_once(target))
    seq.append(_default_pipeline(target, database))
    inner = tvm.transform.Sequential(seq, name="scanweaver.pipeline")

    @tvm.transform.module_pass(opt_level=0, name="scanweaver.Pipeline")
    def _pipeline(mod, _ctx):
        with target:       # (tvm.compile enters it too; applied by hand, the rules need it)
            return inner(mod)

    return _pipeline


def compile(mod, target="llvm", realization="tir", database=None, weights=None):  # noqa: A001 (mirrors tvm.compile)
    """Fuse recurrences, lower each scan with ``realization`` for ``target``, then TVM's default
    pipeline with our rules (``pipeline``); returns an Executable for ``relax.VirtualMachine``.
    ``"llvm"`` is the host CPU.
    ``database``: MetaSchedule records from ``tune``: every scan and (on a CPU) every fused
    kernel with a record uses its best; the rest are scheduled as without.  ``weights``:
    a weight format (``"int8"``, ``"int4"``, ``"int4_asym_g32"``, ...:
    ``scanweaver_core.weight_formats``) quantizes the constant dense weights
    (``relax_pass.quantize_weights``; the model's precision changed because you asked); None
    keeps them."""
    target = _target(target)
    seq = pipeline(target, realization, database, weights)
    with compile_watch.watch():          # a pass of TVM's running long is reported as it runs
        return tvm.compile(mod, target=target, relax_pipeline=seq)


def _legalize_and_fold_at_once(target):
    """The CPU pipeline's first steps, library dispatch and ``LegalizeOps``, then the
    constant ``call_tir`` calls folded with one LLVM build (``fold_constants``), where the
    pipeline's own ``FoldConstant`` builds one module per function it folds.  The dispatch and
    ``LegalizeOps`` that the pipeline then runs find nothing left to do."""
    from tvm.relax.backend.cpu_generic import pipeline as cpu  # pylint: disable=import-outside-toplevel

    @tvm.transform.module_pass(opt_level=0, name="scanweaver.LegalizeAndFoldAtOnce")
    def _pass(mod, _ctx):
        with target:
            mod = tvm.transform.Sequential(widen.passes(target) + cpu.library_dispatch_passes(target)
                                           + [relax.transform.LegalizeOps()])(mod)
        return fold_constants.fold_constant_calls(mod)

    return _pass
