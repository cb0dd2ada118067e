"""``--target``, ``--arch`` and ``--realization`` of the ``scanweaver-tvm`` subcommands that
compile: checked without TVM first (so a typo costs seconds), then resolved to a TVM Target,
and named in the tool's output."""
import json

from .cli_model import CLIError, _describe, _one_line

REALIZATION_CHOICES = ("tir", "mlir")
DEFAULT_CUDA_ARCH = "sm_90"


def _target_request(args):
    """``--target``/``--arch`` as what ``api`` takes (str or dict), checked without TVM."""
    text, arch = args.target, getattr(args, "arch", None)
    if text == "llvm":
        if arch:
            raise CLIError("--arch applies to CUDA targets only")
        return "llvm"
    if text == "cuda":
        return {"kind": "cuda", "arch": arch} if arch else "cuda"
    if text.lstrip().startswith("{"):
        try:
            target = json.loads(text)
        except json.JSONDecodeError as err:
            raise CLIError(f"--target: not valid JSON ({err})") from err
        if not isinstance(target, dict) or target.get("kind") not in ("llvm", "cuda"):
            raise CLIError('--target: a JSON target needs "kind": "llvm" or "cuda"')
        if arch:
            if target["kind"] != "cuda":
                raise CLIError("--arch applies to CUDA targets only")
            target["arch"] = arch
        return target
    raise CLIError(f"--target {text!r}: use llvm, cuda, or a JSON target such as "
                   f"'{{\"kind\": \"cuda\", \"arch\": \"sm_80\"}}'")


def _is_cuda(request):
    return request == "cuda" or (isinstance(request, dict) and request.get("kind") == "cuda")


def _resolve(request, realization, steps):
    """Load TVM, then the Target for ``request`` and a check that ``realization`` exists
    (before the slow import, so a typo costs seconds, not minutes)."""
    with steps("loading TVM", "cannot load TVM"):
        import tvm

        import tir_schedules

        from . import api
    if request == "cuda":
        # with a GPU here TVM takes its arch; without one it would fall back to sm_50.  48 KiB
        # of shared memory per block is what DLight assumes anyway (it warns when it is unset)
        request = {"kind": "cuda"} if tvm.cuda(0).exist else {
            "kind": "cuda", "arch": DEFAULT_CUDA_ARCH, "max_shared_memory_per_block": 49152}
    try:
        target = tir_schedules.resolve_target(request)
        tir_schedules.target_kind(target)
    except Exception as err:
        raise CLIError(f"--target: {_describe(err)}") from err
    try:
        api.passes(target, realization)
        if realization == "mlir":
            from mlir_bridge import tools

            tools.find("mlir-opt")
    except (ValueError, RuntimeError) as err:
        raise CLIError(f"--realization {realization}: {_one_line(err)}") from err
    return target


def _describe_target(target):
    kind = target.kind.name
    if kind == "cuda":
        return f"cuda ({target.arch})" if getattr(target, "arch", None) else "cuda"
    mcpu = str(target.attrs["mcpu"]) if "mcpu" in target.attrs else ""
    return f"llvm ({mcpu})" if mcpu else "llvm"
