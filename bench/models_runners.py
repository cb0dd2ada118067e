"""The paths ``bench.models`` runs a model on, each built, checked against PyTorch and returned
as a callable to time: TVM with and without the pass (on the Relax VM), PyTorch eager, OpenVINO
and ONNX Runtime; a path that fails to build is a failed cell, not a failed run."""
from . import rel_err
from .models_report import THREADS, TOL
from .models_timing import log, step

PATHS = (("with", "TVM + pass"), ("without", "TVM, no pass"))


def _flat(x):
    """Leaves of nested outputs: torch tensors, or TVM tensors in (tvm_ffi) Arrays."""
    if hasattr(x, "numpy"):
        return [x]
    return [y for item in x for y in _flat(item)]


def vm_runner(ex, inputs):
    """``(run, vm, args)``: ``run()`` calls ``main`` once on inputs already on the device."""
    import tvm
    from tvm import relax

    dev = tvm.cpu()
    vm = relax.VirtualMachine(ex, dev)
    args = [tvm.runtime.tensor(x.numpy(), dev) for x in inputs]
    main = vm["main"]
    return (lambda: main(*args)), vm, args


def check(out, want):
    """Max relative error over the model's outputs (TVM returns a tuple of them)."""
    got = _flat(out)
    if len(got) != len(want):
        raise AssertionError(f"{len(got)} outputs from TVM, {len(want)} from PyTorch")
    return max(rel_err(g.numpy(), w) for g, w in zip(got, want))


def tvm_path(which, mod, inputs, want):
    """Compile ``mod`` with (``which == "with"``) or without the pass and check it; returns
    ``(res, (run, vm, args))``, the runner None when the path failed."""
    import tvm

    from scanweaver_tvm import api

    res = {}
    label = dict(PATHS)[which]
    try:
        with step(f"compiling {label}", res, "compile_s"):
            if which == "with":
                ex = api.compile(mod, "llvm")
            else:
                ex = tvm.compile(mod, target=api._target("llvm"))
        # tvm.compile returns before LLVM has made machine code: the first VirtualMachine on
        # an Executable JITs the whole module (LLVM's backend over every PrimFunc).  That is
        # compile time too, so it is measured and counted in "to runnable".
        with step(f"loading {label} (first VirtualMachine: LLVM JIT)", res, "load_s"):
            runner = vm_runner(ex, inputs)
            runner[0]()
        res["runnable_s"] = res["compile_s"] + res["load_s"]
        res["rel_err"] = check(runner[0](), want)
        res["ok"] = res["rel_err"] <= TOL
    except Exception as e:  # a failed path is a failed cell, not a failed run
        res.update(ok=False, error=f"{type(e).__name__}: {e}".splitlines()[0][:300])
        log(f"  {label}: FAILED: {res['error']}")
        return res, None
    log(f"  {label:14s} compile {res['compile_s']:.1f} s + JIT {res['load_s']:.1f} s = "
        f"{res['runnable_s']:.1f} s   rel err {res['rel_err']:.1e} {'OK' if res['ok'] else 'FAILED CHECK'}")
    return res, runner


def eager_runner(model, inputs, threads):
    import torch

    def run():
        torch.set_num_threads(threads)
        try:
            with torch.no_grad():
                return model(*inputs)
        finally:
            torch.set_num_threads(THREADS)
    return run


def openvino_runner(model, inputs, want, threads=THREADS):
    """OpenVINO on ``ov.convert_model`` of the same PyTorch module, compiled for its CPU plugin
    at f32 (``INFERENCE_PRECISION_HINT``: its default on AVX-512/AMX CPUs is bf16) with
    ``threads`` threads, checked against PyTorch.  Returns ``(res, run)``; where the
    conversion or the compile fails, ``res["error"]`` says why and ``run`` is None."""
    import torch

    res = {}
    try:
        import openvino as ov                      # (pyproject's bench extra)

        res["version"] = ov.__version__
        with step("converting to OpenVINO (ov.convert_model)", res, "convert_s"), torch.no_grad():
            converted = ov.convert_model(model, example_input=tuple(inputs))
        with step("compiling OpenVINO (CPU plugin, f32)", res, "compile_s"):
            compiled = ov.Core().compile_model(converted, "CPU", {
                "INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": threads,
                "PERFORMANCE_HINT": "LATENCY"})
        res["precision"] = str(compiled.get_property("INFERENCE_PRECISION_HINT"))
        res["threads"] = int(compiled.get_property("INFERENCE_NUM_THREADS"))
        request = compiled.create_infer_request()
        feed = [x.numpy() for x in inputs]

        def run():
            request.infer(feed)
            return [request.get_output_tensor(i).data for i in range(len(compiled.outputs))]

        got = run()
        if len(got) != len(want):
            raise AssertionError(f"{len(got)} outputs from OpenVINO, {len(want)} from PyTorch")
        res["rel_err"] = max(rel_err(g, w) for g, w in zip(got, want))
        res["ok"] = res["rel_err"] <= TOL
        log(f"  OpenVINO       convert {res['convert_s']:.1f} s + compile {res['compile_s']:.1f} s   "
            f"rel err {res['rel_err']:.1e} ({res['precision']}, {res['threads']} threads)")
        return res, run
    except Exception as e:  # pylint: disable=broad-except  # a failed cell, not a failed run
        res["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        log(f"  OpenVINO: FAILED: {res['error']}")
        return res, None


def onnx_runtime(model, inputs, want):
    """ONNX Runtime (CPU provider, its default threads) on ``torch.onnx.export`` of ``model``
    (the TorchScript exporter: the loop unrolled, as our ONNX tests export), checked against
    PyTorch.  Returns ``(res, run)``; where the export or the session fails, the cell says why."""
    import io
    import warnings

    import onnxruntime
    import torch

    res = {}
    try:
        with step("exporting to ONNX (torch.onnx.export, TorchScript)", res, "export_s"):
            f = io.BytesIO()
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                torch.onnx.export(model, tuple(inputs), f, dynamo=False, opset_version=17)
        with step("loading ONNX Runtime session", res, "session_s"):
            session = onnxruntime.InferenceSession(f.getvalue(), providers=["CPUExecutionProvider"])
        feed = {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs)}
        res["rel_err"] = max(rel_err(o, w) for o, w in zip(session.run(None, feed), want))
        res["ok"] = res["rel_err"] <= TOL
        log(f"  ONNX Runtime   rel err {res['rel_err']:.1e}")
        return res, (lambda: session.run(None, feed))
    except Exception as e:  # pylint: disable=broad-except  # a failed cell, not a failed run
        res["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        log(f"  ONNX Runtime: FAILED: {res['error']}")
        return res, None
