"""TensorIR realizations of ScanWeaver scans (conventions: README.md in this folder).

Each realization is a module (``NAME``, ``TARGET``, ``FORM``, ``applies``, ``default_config``,
``generate``).  ``realize`` picks one for a spec and a target the way DLight picks rules: the
first that applies, in order of preference, unless a schedule is named.  A spec with a
counterpart on the same bytes (``instance``: a selective scan and its matrix-scan instance)
may also be realized by the counterpart's kernels.
"""
import tvm

from scanweaver_core.spec import (AffineScanSpec, DeltaScanSpec, MatrixScanSpec, MLSTMScanSpec, StabilizedScanSpec,
                                  static_or)
from scanweaver_core.targets import host_target, resolve_target  # noqa: F401 (part of this API)

from . import (cpu, delta_cpu, gpu_blelloch, gpu_chunked, gpu_warp, instance, matrix_cpu, matrix_gpu, mlstm_cpu,
               mlstm_gpu, selective_cpu, selective_gpu, stabilized_cpu, stabilized_gpu)

REALIZATIONS = {m.NAME: m for m in (cpu, gpu_warp, gpu_chunked, gpu_blelloch,
                                    selective_cpu, selective_gpu, matrix_cpu, matrix_gpu,
                                    stabilized_cpu, stabilized_gpu, mlstm_cpu, mlstm_gpu, delta_cpu)}


def target_kind(target):
    """``"cuda"`` or ``"cpu"`` for a target given as str, dict or ``tvm.target.Target``."""
    kind = tvm.target.Target(target).kind.name
    if kind == "cuda":
        return "cuda"
    if kind in ("llvm", "c"):
        return "cpu"
    raise ValueError(f"target: kind {kind!r} is not supported (use llvm or cuda)")


def _native(spec, kind):
    form = ("affine" if isinstance(spec, AffineScanSpec) else
            "matrix" if isinstance(spec, MatrixScanSpec) else
            "stabilized" if isinstance(spec, StabilizedScanSpec) else
            "mlstm" if isinstance(spec, MLSTMScanSpec) else
            "delta" if isinstance(spec, DeltaScanSpec) else "selective")
    names = [n for n, m in REALIZATIONS.items() if m.TARGET == kind and m.FORM == form and m.applies(spec)]
    if kind == "cuda" and form == "affine":
        # few lanes and a long L leave SMs idle with one block per lane: split L across blocks
        # (a symbolic extent counts as large: many lanes, a long L)
        few_lanes = static_or(spec.lanes, 1 << 30) < 132 and static_or(spec.length, 1 << 30) >= 8192
        names.sort(key=lambda n: {"chunked": 0 if few_lanes else 2, "warp": 1}.get(n, 3))
    return names


def _candidates(spec, kind):
    """``[(realization name, the spec it is generated for)]`` in order of preference: the
    spec's own realizations, then those of its counterpart on the same bytes (a selective
    scan and its matrix-scan instance, ``instance.counterpart``)."""
    own = [(n, spec) for n in _native(spec, kind)]
    other = instance.counterpart(spec)
    return own + ([(n, other) for n in _native(other, kind)] if other is not None else [])


def _preferred(spec, kind):
    return [name for name, _ in _candidates(spec, kind)]


def realize(spec, target="llvm", schedule=None, **config):
    """The scheduled PrimFunc ``scanweaver_scan`` for ``spec`` on ``target``.

    ``schedule`` names a realization (see ``REALIZATIONS``), of the spec's form or of its
    counterpart's (then generated for that and re-declared on this spec's buffers);
    ``config`` overrides its defaults.
    """
    kind = target_kind(target)
    candidates = dict(_candidates(spec, kind))          # name -> the spec it is generated for
    if schedule is None:
        if not candidates:
            raise ValueError(f"spec: no {kind} realization applies to {spec}")
        schedule = _preferred(spec, kind)[0]
    if schedule not in candidates:
        raise ValueError(f"schedule: {schedule!r} is not a {kind} realization of this spec; "
                         f"choose from {_preferred(spec, kind)}")
    module, generated_for = REALIZATIONS[schedule], candidates[schedule]
    func = module.generate(generated_for, **{**module.default_config(generated_for), **config})
    return func if generated_for is spec else instance.retarget(func, spec)


def build(spec, target="llvm", schedule=None, **config):
    """Compile ``realize(...)`` with TVM; returns the runtime module (function ``scanweaver_scan``).

    ``"llvm"`` builds for the host CPU (AVX2/AVX-512 where present)."""
    func = realize(spec, target, schedule, **config)
    return tvm.compile(tvm.IRModule({"scanweaver_scan": func}), target=resolve_target(target)).mod
