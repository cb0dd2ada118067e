"""TensorIR realizations of ScanWeaver scans (conventions: README.md in this folder).

Each realization is a module (``NAME``, ``TARGET``, ``FORM``, ``applies``, ``default_config``,
``generate``).  ``realize`` picks one for a spec and a target the way DLight picks rules: the
first that applies, in order of preference, unless a schedule is named.
"""
import tvm

from scanweaver_core.spec import AffineScanSpec, MatrixScanSpec, static_or
from scanweaver_core.targets import host_target, resolve_target  # noqa: F401 (part of this API)

from . import (cpu, gpu_blelloch, gpu_chunked, gpu_warp, matrix_cpu, matrix_gpu, selective_cpu,
               selective_gpu)

REALIZATIONS = {m.NAME: m for m in (cpu, gpu_warp, gpu_chunked, gpu_blelloch,
                                    selective_cpu, selective_gpu, matrix_cpu, matrix_gpu)}


def target_kind(target):
    """``"cuda"`` or ``"cpu"`` for a target given as str, dict or ``tvm.target.Target``."""
    kind = tvm.target.Target(target).kind.name
    if kind == "cuda":
        return "cuda"
    if kind in ("llvm", "c"):
        return "cpu"
    raise ValueError(f"target: kind {kind!r} is not supported (use llvm or cuda)")


def _preferred(spec, kind):
    form = ("affine" if isinstance(spec, AffineScanSpec) else
            "matrix" if isinstance(spec, MatrixScanSpec) else "selective")
    names = [n for n, m in REALIZATIONS.items() if m.TARGET == kind and m.FORM == form and m.applies(spec)]
    if kind == "cuda" and form == "affine":
        # few lanes and a long L leave SMs idle with one block per lane: split L across blocks
        # (a symbolic extent counts as large: many lanes, a long L)
        few_lanes = static_or(spec.lanes, 1 << 30) < 132 and static_or(spec.length, 1 << 30) >= 8192
        names.sort(key=lambda n: {"chunked": 0 if few_lanes else 2, "warp": 1}.get(n, 3))
    return names


def realize(spec, target="llvm", schedule=None, **config):
    """The scheduled PrimFunc ``scanweaver_scan`` for ``spec`` on ``target``.

    ``schedule`` names a realization (see ``REALIZATIONS``); ``config`` overrides its defaults.
    """
    kind = target_kind(target)
    if schedule is None:
        names = _preferred(spec, kind)
        if not names:
            raise ValueError(f"spec: no {kind} realization applies to {spec}")
        schedule = names[0]
    module = REALIZATIONS.get(schedule)
    if module is None or module.TARGET != kind or not module.applies(spec):
        raise ValueError(f"schedule: {schedule!r} is not a {kind} realization of this spec; "
                         f"choose from {_preferred(spec, kind)}")
    return module.generate(spec, **{**module.default_config(spec), **config})


def build(spec, target="llvm", schedule=None, **config):
    """Compile ``realize(...)`` with TVM; returns the runtime module (function ``scanweaver_scan``).

    ``"llvm"`` builds for the host CPU (AVX2/AVX-512 where present)."""
    func = realize(spec, target, schedule, **config)
    return tvm.compile(tvm.IRModule({"scanweaver_scan": func}), target=resolve_target(target)).mod
