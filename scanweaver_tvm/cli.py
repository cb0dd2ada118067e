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
import signal
import sys
import warnings

from . import cli_generate, cli_mlir
from .cli_compile import cmd_compile, cmd_show_tir
from .cli_model import CHECKPOINT_LENGTH, CLIError, _describe, _one_line
from .cli_report import cmd_report
from .cli_steps import PROG, _Steps
from .cli_target import DEFAULT_CUDA_ARCH, REALIZATION_CHOICES

EXIT_ERROR = 2

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
