"""``scanweaver-tvm show-tir MODEL`` and ``scanweaver-tvm compile MODEL -o OUTPUT``: lower the
scans for a target (and print their scheduled TIR), or compile the whole model, check its CUDA C
with nvcc and ptxas, and write the library atomically."""
import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from .cli_model import CLIError, _import_model, _one_line, model_arg
from .cli_report import _existing_scans, _signature
from .cli_steps import PROG
from .cli_target import DEFAULT_CUDA_ARCH, _describe_target, _is_cuda, _resolve, _target_request


def cmd_show_tir(args, steps):
    spec = model_arg(args)
    target = _resolve(_target_request(args), args.realization, steps)
    mod = _import_model(spec, args.length, steps, args.dynamic_dim)
    from tvm import tirx

    from . import api

    with steps(f"lowering scans for {_describe_target(target)}", "cannot lower the scans"):
        lowered = api.passes(target, args.realization)(mod)
    funcs = [(g.name_hint, f) for g, f in lowered.functions_items()
             if isinstance(f, tirx.PrimFunc) and g.name_hint.startswith("scanweaver_scan")]
    if not funcs:
        print(f"# {spec}: no scan (no recurrence was fused; `{PROG} report` says why)")
        return 0
    for i, (name, func) in enumerate(sorted(funcs, key=lambda nf: nf[0])):
        if i:
            print()
        print(f"# {name}: {spec}, {args.realization} realization for {_describe_target(target)}")
        print(func.script())
    return 0


def _check_cuda(executable, target, steps):
    """Compile the generated CUDA C with nvcc and assemble it with ptxas: the library holds CUDA
    C that TVM compiles when it is loaded, so this is where its errors can be caught here."""
    from tir_schedules import cuda_check

    arch = str(target.arch) if getattr(target, "arch", None) else DEFAULT_CUDA_ARCH
    sources = cuda_check.module_cuda_sources(executable.mod)
    reports = []
    with steps(f"checking the CUDA C with nvcc and ptxas ({arch})", "the generated CUDA C does not build"):
        for source in sources:
            try:
                text = cuda_check.ptx(source, arch)
            except RuntimeError as err:
                msg = str(err).split("Compilation error:", 1)[-1]
                errors = [line.strip() for line in msg.splitlines() if "error" in line]
                raise CLIError(f"nvcc rejected the generated CUDA C for {arch}: "
                               f"{_one_line(errors[0] if errors else msg, 300)}") from err
            reports.append(cuda_check.ptxas(text, arch))
        for text in cuda_check.module_ptx(executable.mod):      # the MLIR realization's PTX
            reports.append(cuda_check.ptxas(text, arch))
    return arch, reports


def _write_atomically(executable, output):
    """``export_library`` to a temporary file next to ``output``, then rename: ``output`` is
    either the complete new library or untouched."""
    fd, tmp = tempfile.mkstemp(dir=output.parent, prefix=f".{output.name}.", suffix=output.suffix or ".so")
    os.close(fd)
    try:
        executable.export_library(tmp)
        umask = os.umask(0)
        os.umask(umask)
        executable_bits = output.suffix not in (".tar",)
        os.chmod(tmp, (0o777 if executable_bits else 0o666) & ~umask)
        os.replace(tmp, output)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def cmd_compile(args, steps):
    spec = model_arg(args)
    output = Path(args.output)
    if output.is_dir():
        raise CLIError(f"-o {args.output}: is a directory; give a file name such as model.so")
    if not output.parent.is_dir():
        raise CLIError(f"-o {args.output}: folder {output.parent} does not exist")
    if not os.access(output.parent, os.W_OK):
        raise CLIError(f"-o {args.output}: folder {output.parent} is not writable")
    request = _target_request(args)
    cuda = _is_cuda(request)
    if cuda and not args.no_nvcc_check and shutil.which("nvcc") is None:
        raise CLIError("--target cuda: nvcc is not on PATH; it checks the generated CUDA C before "
                       "the library is written (install the CUDA toolkit, or pass --no-nvcc-check)")
    target = _resolve(request, args.realization, steps)
    mod = _import_model(spec, args.length, steps, args.dynamic_dim)

    from . import api

    found = api.find_recurrences(mod)
    existing = _existing_scans(mod)
    where = _describe_target(target)
    quantized = f", {args.weights} weights" if args.weights else ""
    with steps(f"compiling for {where} with {args.realization} scans{quantized}", "compilation failed"):
        executable = api.compile(mod, target=target, realization=args.realization, weights=args.weights)
    checked = None
    if cuda and not args.no_nvcc_check:
        checked = _check_cuda(executable, target, steps)
    with steps(f"writing {output}", f"cannot write {output}"):
        _write_atomically(executable, output)

    scans = len(found) + len(existing)
    size = output.stat().st_size
    print(f"wrote {output} ({size / 1024:.0f} KiB): {spec} for {where}, "
          f"{scans} scan{'s' if scans != 1 else ''} ({args.realization}){quantized}")
    signature = _signature(mod)
    if signature:
        print(f"  entry: {signature}")
    device = "tvm.cuda()" if cuda else "tvm.cpu()"
    print(f"  run:   relax.VirtualMachine(tvm.runtime.load_module({str(output)!r}), {device})[\"main\"](...)")
    if checked:
        arch, reports = checked
        regs = max((r.registers for r in reports), default=0)
        spills = sum(r.spill_stores + r.spill_loads for r in reports)
        smem = max((r.shared_bytes for r in reports), default=0)
        print(f"  cuda:  kernels checked with nvcc + ptxas for {arch}: up to {regs} registers, "
              f"{smem} B shared memory, {'no spills' if not spills else f'{spills} B spilled'}")
    elif cuda:
        print("  cuda:  NOT checked (--no-nvcc-check): the CUDA C was not compiled here, so an "
              "error in it shows only when the library is loaded on the GPU machine")
    if cuda:
        print("  note:  the library holds the kernels as CUDA C, which TVM compiles for the GPU when "
              "the library is loaded (NVRTC via the cuda-bindings package, or nvcc with "
              "TVM_CUDA_COMPILE_MODE=nvcc)" + ("; the scans as PTX from MLIR, loaded as they are"
                                               if args.realization == "mlir" else ""))
    if not scans:
        steps.note(f"{PROG}: note: no recurrence found in {spec}; compiled as plain TVM")
    return 0
