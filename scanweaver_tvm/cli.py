"""``scanweaver-tvm``: find, show and compile the ScanWeaver scans of a model from the shell.

    scanweaver-tvm report   MODEL                       recurrences found, and near misses with why
    scanweaver-tvm show-tir MODEL [--target cuda]       the scheduled TIR of every scan
    scanweaver-tvm compile  MODEL [--target ...] [--realization mlir] [--weights int8] -o model.so
    scanweaver-tvm mlir     MODEL [--stage all|ptx|NAME]  each scan's IR through the MLIR stages
    scanweaver-tvm generate CHECKPOINT_DIR (--prompt TEXT | --prompt-ids 1,2,3) [--weights int4]

MODEL is an ONNX file (``model.onnx``), a transformers checkpoint directory, or a factory,
``path/to/file.py:make`` or ``package.module:make``, whose call returns ``(torch model, example
inputs)``.

Every failure is one line on stderr (``scanweaver-tvm: error: ...``) and exit status 2; progress
of the slow steps goes to stderr too (``-q`` silences it), results to stdout.  ``--debug`` shows
the full traceback instead.
"""
import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import warnings
from pathlib import Path

from . import cli_generate, cli_mlir
from .cli_model import CHECKPOINT_LENGTH, CLIError, _describe, _import_model, _one_line, model_arg

PROG = "scanweaver-tvm"
EXIT_ERROR = 2
REALIZATION_CHOICES = ("tir", "mlir")
DEFAULT_CUDA_ARCH = "sm_90"

_MODEL_HELP = f"""\
MODEL is one of
  path/to/model.onnx         an ONNX file (TVM's Relax ONNX frontend; ONNX Scan/Loop
                             recurrences become scans while importing)
  path/to/checkpoint/        a transformers checkpoint directory (config.json + weights, as
                             save_pretrained writes it), loaded with AutoModelForCausalLM as
                             compile_causal_lm loads it; its forward is traced on token ids of
                             shape (1, --length), {CHECKPOINT_LENGTH} by default
  path/to/file.py:FACTORY    a Python file, imported by path; FACTORY() returns
                             (torch.nn.Module, example inputs); the model is put in eval()
                             mode and imported with torch.export
  package.module:FACTORY     the same, for an importable module
                             (e.g. scanweaver_tvm.models:ema)
--length N is passed to FACTORY as length=N (every factory in scanweaver_tvm.models takes it);
for a checkpoint it is the prompt length traced."""

_EPILOG = _MODEL_HELP + """

Progress of the slow steps (loading TVM, importing, compiling) goes to stderr, results to
stdout.  An error is one line on stderr, 'scanweaver-tvm: error: ...', with exit status 2.

examples:
  scanweaver-tvm report scanweaver_tvm.models:mamba_block --length 64
  scanweaver-tvm report path/to/checkpoint
  scanweaver-tvm show-tir scanweaver_tvm.models:ema --target cuda
  scanweaver-tvm compile my_models.py:make -o model.so
  scanweaver-tvm compile path/to/checkpoint --weights int8 -o model.so
  scanweaver-tvm compile model.onnx --target cuda --arch sm_90 -o model_cuda.so
  scanweaver-tvm generate path/to/checkpoint --prompt-ids 1,2,3 --max-new-tokens 20 --weights int4
  scanweaver-tvm generate scanweaver_tvm/demo_model --prompt "ROMEO:" --max-new-tokens 40"""


class _Steps:
    """Progress lines on stderr ('importing X ... done in 3.2 s') and the error context of each
    step: an unexpected exception inside becomes a CLIError '<failing>: <exception>'."""

    def __init__(self, quiet=False, debug=False):
        self.quiet, self.debug = quiet, debug

    def note(self, text):
        if not self.quiet:
            print(text, file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def __call__(self, doing, failing):
        if not self.quiet:
            sys.stderr.write(f"{doing} ... ")
            sys.stderr.flush()
        start = time.perf_counter()
        try:
            yield
        except BaseException as err:
            if not self.quiet:
                sys.stderr.write(f"failed after {time.perf_counter() - start:.1f} s\n")
                sys.stderr.flush()
            if isinstance(err, Exception) and not isinstance(err, CLIError) and not self.debug:
                raise CLIError(f"{failing}: {_describe(err)}") from err
            raise
        if not self.quiet:
            sys.stderr.write(f"done in {time.perf_counter() - start:.1f} s\n")
            sys.stderr.flush()


# -- target ----------------------------------------------------------------------------------

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


# -- report ----------------------------------------------------------------------------------

def _span(names):
    return names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}"


def _recurrence_line(rec):
    direction = "reverse" if rec.reverse else "forward"
    shape = "x".join(str(d) for d in rec.state_shape) or "scalar"
    return (f"{rec.form:<9} L={rec.length:<5} axis={rec.axis}  {direction:<7}  state {shape} "
            f"{rec.dtype}  in {rec.function} ({len(rec.bindings)} step bindings {_span(rec.bindings)})")


def _near_miss_lines(rejected):
    """One line per finding (the pass already reports a loop's lone steps as one)."""
    return [f"{r.form:<9} in {r.function} ({_span(r.bindings)}): {r.reason}" for r in rejected]


def _existing_scans(mod):
    """Scans already in the module (the ONNX importer makes Scan/Loop into scans directly)."""
    from tvm import relax

    from scanweaver_core.scan_op import parse_scan

    found = []
    for gvar, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        for block in func.body.blocks:
            for binding in block.bindings:
                parsed = parse_scan(getattr(binding, "value", None))
                if parsed is not None:
                    found.append((gvar.name_hint, _name(binding.var), parsed[0]))
    return found


def _spec_line(function, var, spec, origin):
    from scanweaver_core.spec import AffineScanSpec, MatrixScanSpec, StabilizedScanSpec, symbol_name

    if isinstance(spec, StabilizedScanSpec):
        extras = "".join(f" {name}" for name, on in (
            ("den-only", not spec.has_values), ("bonus", spec.has_bonus), ("h0", spec.has_h0),
            ("channel-major", spec.layout == "channel_major")) if on)
        return (f"{'stabilized':<9} L={spec.length:<5} batch={spec.batch} channels={spec.channels} "
                f"decay={spec.decay}{extras} {'reverse' if spec.reverse else 'forward'} {spec.dtype}  "
                f"in {function} ({var}: {origin})")
    if isinstance(spec, MatrixScanSpec):
        extras = "".join(f" {name}" for name, on in (
            ("channel-major", spec.layout == "channel_major"), ("skip", spec.has_skip),
            ("gate", spec.has_gate)) if on)
        return (f"{'matrix':<9} L={symbol_name(spec.length):<5} batch={spec.batch} heads={spec.heads} "
                f"K={spec.key} V={spec.value} decay={spec.decay}{extras} "
                f"{'reverse' if spec.reverse else 'forward'} {spec.dtype}  in {function} ({var}: {origin})")
    if isinstance(spec, AffineScanSpec):
        shape = "x".join(str(d) for d in spec.state_shape) or "scalar"
        direction = "reverse" if spec.reverse else "forward"
        return (f"{'affine':<9} L={symbol_name(spec.length):<5} axis={spec.axis}  {direction:<7}  state {shape} "
                f"{spec.dtype}  in {function} ({var}: {origin})")
    return (f"{'selective':<9} L={symbol_name(spec.length):<5} batch={spec.batch} dim={spec.dim} dstate={spec.dstate} "
            f"{spec.dtype}  in {function} ({var}: {origin})")


def _is_stabilized(spec):
    from scanweaver_core.spec import StabilizedScanSpec

    return isinstance(spec, StabilizedScanSpec)


def cmd_report(args, steps):
    spec = model_arg(args)
    with steps("loading TVM", "cannot load TVM"):
        from . import api
    mod = _import_model(spec, args.length, steps, args.dynamic_dim)
    with steps("analyzing", "cannot analyze the module"):
        found = api.find_recurrences(mod, include_rejected=True)
        existing = _existing_scans(mod)
    accepted = [r for r in found if not r.rejected]
    rejected = [r for r in found if r.rejected]
    near = _near_miss_lines(rejected)
    total = len(accepted) + len(existing)
    print(f"{spec}: {total} recurrence{'s' if total != 1 else ''} to scan, "
          f"{len(near)} near miss{'es' if len(near) != 1 else ''}")
    signature = _signature(mod)
    if signature:
        print(f"  entry: {signature}")
    for rec in accepted:
        print(f"  scan       {_recurrence_line(rec)}")
    for function, var, scan_spec in existing:
        origin = ("fused in every trace, then generalized" if args.dynamic_dim or scan_spec.is_symbolic
                  else "torch.logcumsumexp, imported as a scan" if _is_stabilized(scan_spec)
                  else "an ONNX Scan/Loop, imported as a scan" if spec.kind == "onnx"
                  else "a torch scan, imported as a scan")
        print(f"  scan       {_spec_line(function, var, scan_spec, origin)}")
    for line in near:
        print(f"  left as is {line}")
    if not total and not near:
        print("  (no affine recurrence h = a*h + b found: nothing for ScanWeaver to do)")
    return 0


# -- show-tir --------------------------------------------------------------------------------

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


# -- compile ---------------------------------------------------------------------------------

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


def _name(var):
    """A Relax Var's name (``.name`` in this TVM, ``.name_hint`` in older ones)."""
    return getattr(var, "name", None) or getattr(var, "name_hint", "?")


def _signature(mod):
    import tvm
    from tvm import relax

    main = mod["main"] if any(g.name_hint == "main" for g in mod.get_global_vars()) else None
    if not isinstance(main, relax.Function):
        return None

    def ty(v):
        t = getattr(v, "ty", None)
        shape = getattr(t, "shape", None)
        try:
            dims = ", ".join(str(int(d)) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in shape)
        except TypeError:            # no static rank
            dims = "..."
        return f"{_name(v)}: {getattr(t, 'dtype', '?')}[{dims}]"

    return "main(" + ", ".join(ty(p) for p in main.params) + ")"


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


# -- argument parsing ------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (no usage dump) with exit status 2."""

    def error(self, message):
        hint = f" (see {self.prog} --help)"
        self.exit(EXIT_ERROR, f"{PROG}: error: {_one_line(message)}{hint}\n")


def _weight_format(text):
    """``--weights FORMAT``: a name ``weight_format`` takes, checked before anything loads."""
    from scanweaver_core.weight_formats import NAMES, weight_format

    try:
        weight_format(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"unknown weight format {text!r}; the formats are "
                                         f"{', '.join(NAMES)}") from None
    return text


def _positive(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def build_parser():
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    common.add_argument("--debug", action="store_true",
                        help="on failure show the full Python traceback, and show library warnings")

    from scanweaver_core.weight_formats import NAMES

    weights = argparse.ArgumentParser(add_help=False)
    weights.add_argument("--weights", type=_weight_format, metavar="FORMAT",
                         help=f"quantize the dense layers' weights to FORMAT: {', '.join(NAMES)} "
                              "(scanweaver_core.weight_formats; default: keep the model's)")

    model = argparse.ArgumentParser(add_help=False)
    model.add_argument("model", metavar="MODEL",
                       help="model.onnx, a checkpoint directory, path/to/file.py:FACTORY or "
                            "package.module:FACTORY")
    model.add_argument("--length", type=_positive, metavar="N",
                       help=f"call FACTORY(length=N); for a checkpoint, the prompt length traced "
                            f"(default {CHECKPOINT_LENGTH}); not for ONNX files")
    model.add_argument("--dynamic-dim", action="append", metavar="INPUT:DIM[=NAME]",
                       help="make dim DIM of input INPUT (index or argument name) symbolic: the "
                            "model is traced at small sizes and generalized, so one executable "
                            "runs at any size (repeatable; unnamed: dim 0 is 'batch', others 'L')")

    def targets(p):
        p.add_argument("--target", default="llvm", metavar="{llvm,cuda,JSON}",
                       help="llvm (this machine's CPU, default), cuda, or a TVM target as JSON, "
                            "e.g. '{\"kind\": \"cuda\", \"arch\": \"sm_80\"}'")
        p.add_argument("--arch", metavar="SM",
                       help=f"CUDA architecture such as sm_80 or sm_90 (default: this machine's GPU, "
                            f"{DEFAULT_CUDA_ARCH} when it has none)")
        p.add_argument("--realization", default="tir", choices=REALIZATION_CHOICES,
                       help="how scans are lowered: tir (TensorIR schedules, default) or mlir "
                            "(the scanweaver MLIR dialect lowered by mlir-opt)")

    parser = _Parser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_EPILOG,
        description="Find the sequential affine recurrences (h = a*h + b: EMAs, linear RNNs, "
                    "Mamba's selective scan) in a PyTorch or ONNX model or a transformers "
                    "checkpoint, show them as ScanWeaver parallel scans, compile the model with "
                    "TVM, and generate from a checkpoint.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("report", parents=[model, common], formatter_class=argparse.RawDescriptionHelpFormatter,
                       help="list the recurrences found and the near misses left alone (with why)",
                       description="Import MODEL and print, one line each, every recurrence that "
                                   "becomes a scan (form, length L, scan axis, direction, state "
                                   "shape, dtype, the bindings it replaces) and every near miss "
                                   "left as it is, with the reason.", epilog=_MODEL_HELP)
    p.set_defaults(run=cmd_report)

    p = sub.add_parser("show-tir", parents=[model, common], formatter_class=argparse.RawDescriptionHelpFormatter,
                       help="print the scheduled TIR (PrimFunc) of every scan",
                       description="Import MODEL, run ScanWeaver's passes (FuseAffineRecurrences, "
                                   "LowerScans) for the target and print the scheduled TensorIR "
                                   "of each scan as TVMScript.", epilog=_MODEL_HELP)
    targets(p)
    p.set_defaults(run=cmd_show_tir)

    p = sub.add_parser("compile", parents=[model, weights, common], formatter_class=argparse.RawDescriptionHelpFormatter,
                       help="compile MODEL with its scans and export a shared library",
                       description="Import MODEL, compile it with scanweaver_tvm.compile (scans, then "
                                   "TVM's default pipeline with our CPU/CUDA rules; --weights "
                                   "quantizes the dense layers) and export the Relax VM executable with "
                                   "export_library.  The library is written to a temporary file in "
                                   "the output's folder and renamed, so OUTPUT is never left "
                                   "half-written.  Load it with tvm.runtime.load_module and run it "
                                   "with relax.VirtualMachine.\n\nFor cuda the kernels' CUDA C is first "
                                   "compiled with nvcc and assembled with ptxas for --arch (the "
                                   "library keeps the CUDA C, which TVM compiles for the GPU when "
                                   "it is loaded); no GPU is needed to compile.",
                       epilog=_MODEL_HELP)
    targets(p)
    p.add_argument("-o", "--output", required=True, metavar="OUTPUT",
                   help="the library to write, e.g. model.so (model.tar for an object archive)")
    p.add_argument("--no-nvcc-check", action="store_true",
                   help="cuda: skip the nvcc/ptxas check of the generated CUDA C (nvcc not needed)")
    p.set_defaults(run=cmd_compile)

    cli_mlir.add_parser(sub, [model, common], argparse.RawDescriptionHelpFormatter, _MODEL_HELP,
                        DEFAULT_CUDA_ARCH)
    cli_generate.add_parser(sub, [weights, common], argparse.RawDescriptionHelpFormatter, _positive)
    return parser


def _sigterm(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None):
    """Run the tool; returns the exit status (0, or 2 on any error)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:        # --help (0) or a usage error, already printed (2)
        return stop.code if isinstance(stop.code, int) else EXIT_ERROR
    steps = _Steps(quiet=args.quiet, debug=args.debug)
    previous = None
    with contextlib.suppress(ValueError):          # not the main thread: leave signals alone
        previous = signal.signal(signal.SIGTERM, _sigterm)
    try:
        with warnings.catch_warnings():
            if not args.debug:
                warnings.simplefilter("ignore")
            return args.run(args, steps)
    except CLIError as err:
        if args.debug:
            raise
        print(f"{PROG}: error: {_one_line(err)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"{PROG}: error: interrupted", file=sys.stderr)
        return 130
    except Exception as err:                 # a bug of ours: still one line, --debug for more
        if args.debug:
            raise
        print(f"{PROG}: error: {args.command} failed: {_describe(err)} (--debug shows the traceback)",
              file=sys.stderr)
        return EXIT_ERROR
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
