"""The ``scanweaver-tvm`` command line: report, show-tir, compile, generate, and one-line errors."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from harness import quantized_copy
from scanweaver_core.weight_formats import NAMES, weight_format
from scanweaver_tvm import cli
from scanweaver_tvm.causal_lm import torch_kernels

EMA = "scanweaver_tvm.models:ema"
SCRIPT = Path(sys.executable).with_name("scanweaver-tvm")

TINY_MODELS = '''
import torch
from torch import nn


class Decay(nn.Module):
    """h_t = g_t * h_{t-1} + x_t, all states stacked."""

    def forward(self, x, g):
        h, outs = torch.zeros_like(x[:, 0]), []
        for t in range(x.shape[1]):
            h = g[:, t] * h + x[:, t]
            outs.append(h)
        return torch.stack(outs, 1)


class Tanh(nn.Module):
    """A near miss: h_t = tanh(g_t * h_{t-1} + x_t) is not affine in h."""

    def forward(self, x, g):
        h, outs = torch.zeros_like(x[:, 0]), []
        for t in range(x.shape[1]):
            h = torch.tanh(g[:, t] * h + x[:, t])
            outs.append(h)
        return torch.stack(outs, 1)


def _inputs(length):
    torch.manual_seed(0)
    return torch.randn(2, length, 3), torch.rand(2, length, 3)


def decay(length=6):
    return Decay(), _inputs(length)


def tanh_rnn(length=6):
    return Tanh(), _inputs(length)


def no_length():
    return Decay(), _inputs(4)


def broken():
    raise RuntimeError("the factory fell over")


def not_a_pair():
    return Decay()
'''


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny_models.py"
    path.write_text(TINY_MODELS)
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A one-layer Mamba saved with save_pretrained, and the model (initialized wide enough
    that its greedy tokens vary)."""
    torch.manual_seed(3)
    model = transformers.MambaForCausalLM(transformers.MambaConfig(
        vocab_size=96, hidden_size=32, state_size=8, num_hidden_layers=1, expand=2, conv_kernel=4,
        initializer_range=0.5)).eval()
    path = tmp_path_factory.mktemp("checkpoint")
    model.save_pretrained(path)
    return path, model


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, *fragments):
    assert code == 2
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("scanweaver-tvm: error: "), err
    for f in fragments:
        assert f in lines[0], err


def test_help_documents_commands_and_model_forms(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for word in ("report", "show-tir", "compile", "mlir", "generate", ".onnx", "checkpoint directory",
                 "file.py:FACTORY", "package.module:FACTORY", "--length", "exit status 2"):
        assert word in out, word
    examples = out.split("examples:")[1]
    for command in ("report", "show-tir", "compile", "generate"):
        assert f"scanweaver-tvm {command} " in examples, command
    assert "--weights" in examples
    code, out, _ = run(capsys, "compile", "--help")
    assert code == 0
    for word in ("--target", "--arch", "--realization", "mlir", "--output", "--no-nvcc-check", "--quiet",
                 "--debug", "temporary file", "--weights", "int4_asym_g32", "checkpoint"):
        assert word in out, word
    code, out, _ = run(capsys, "generate", "--help")
    assert code == 0 and "--weights" in out and "int8_asym" in out


def test_report_ema(capsys):
    code, out, err = run(capsys, "report", EMA, "--length", "8")
    assert code == 0
    scans = [line for line in out.splitlines() if line.strip().startswith("scan ")]
    assert len(scans) == 1, out
    for word in ("affine", "L=8", "axis=1", "forward", "state 2x16", "float32", "in main"):
        assert word in scans[0], out
    assert "1 recurrence to scan, 0 near misses" in out
    assert "importing scanweaver_tvm.models:ema ... done in" in err        # progress on stderr


def test_report_near_miss_from_a_file(capsys, tiny):
    code, out, err = run(capsys, "report", f"{tiny}:tanh_rnn", "--length", "5", "-q")
    assert code == 0 and err == ""
    assert "0 recurrences to scan, 1 near miss" in out
    (line,) = [line for line in out.splitlines() if "left as is" in line]
    assert "relax.tanh" in line and "not affine in h" in line
    assert "and 3 more steps like it" in line              # L-1 lone steps, one finding


def test_report_onnx_scan(capsys, tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    def vi(name, shape):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)

    body = helper.make_graph(
        [helper.make_node("Mul", ["h", "a_t"], ["ah"]), helper.make_node("Add", ["ah", "b_t"], ["hn"]),
         helper.make_node("Identity", ["hn"], ["y_t"])],
        "body", [vi("h", [3]), vi("a_t", [3]), vi("b_t", [3])], [vi("hn", [3]), vi("y_t", [3])])
    scan = helper.make_node("Scan", ["h0", "A", "B"], ["h_last", "Y"], body=body, num_scan_inputs=2)
    graph = helper.make_graph([scan], "g", [vi("h0", [3]), vi("A", [5, 3]), vi("B", [5, 3])],
                              [vi("h_last", [3]), vi("Y", [5, 3])])
    path = tmp_path / "scan.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    code, out, _ = run(capsys, "report", path, "-q")
    assert code == 0
    assert "L=5" in out and "axis=0" in out and "ONNX Scan/Loop" in out


def test_compile_writes_a_library_that_runs_like_torch(capsys, tmp_path):
    import tvm
    from tvm import relax

    from scanweaver_tvm import models

    out_path = tmp_path / "rnn.so"
    code, out, err = run(capsys, "compile", "scanweaver_tvm.models:linear_rnn", "--length", "8", "-o", out_path)
    assert code == 0, err
    assert "compiling for llvm" in err and "done in" in err
    assert f"wrote {out_path}" in out and "1 scan" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rnn.so"]      # no temporary left

    model, args = models.linear_rnn(length=8)
    with torch.no_grad():
        expected = model(*args)
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(out_path)), tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(a.numpy()) for a in args])
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-5, atol=1e-5)


def test_report_a_checkpoint_directory(capsys, checkpoint):
    """A save_pretrained directory is a MODEL: loaded as compile_causal_lm loads it, traced on
    (1, --length) token ids."""
    path, _ = checkpoint
    code, out, err = run(capsys, "report", path, "--length", "8")
    assert code == 0, err
    assert f"importing {path} ... done in" in err and "Loading weights" not in err   # (transformers' bars off)
    assert "1 recurrence to scan, 0 near misses" in out
    assert "int64[1, 8]" in out
    (line,) = [line for line in out.splitlines() if line.strip().startswith("scan ")]
    assert "selective L=8" in line and "state 1x64x8" in line


def test_a_checkpoint_transformers_cannot_load_is_one_line(capsys, tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "no_such_family"}')
    code, out, err = run(capsys, "report", tmp_path, "-q")
    assert_one_line_error(code, err, f"cannot load checkpoint {tmp_path}", "no_such_family")
    assert out == ""


def test_compile_a_checkpoint_with_int8_weights(capsys, tmp_path, checkpoint):
    """``compile CHECKPOINT --weights int8``: the library computes the model whose dense weights
    are their int8 values (within float32 rounding), not the float model (0.3% away)."""
    import tvm
    from tvm import relax

    path, model = checkpoint
    out_path = tmp_path / "mamba_int8.so"
    code, out, err = run(capsys, "compile", path, "--length", "8", "--weights", "int8", "-o", out_path, "-q")
    assert code == 0, err
    assert "1 scan (tir), int8 weights" in out
    ids = torch.tensor([[5, 17, 3, 40, 22, 9, 1, 2]])
    got = relax.VirtualMachine(tvm.runtime.load_module(str(out_path)), tvm.cpu())["main"](tvm.runtime.tensor(ids.numpy()))
    got = (got.numpy() if hasattr(got, "numpy") else got[0].numpy()).astype(np.float64)
    with torch.no_grad(), torch_kernels():
        want = quantized_copy(model, weight_format("int8"))(ids).logits.double().numpy()
        plain = model(ids).logits.double().numpy()
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= 1e-5 * scale
    assert np.abs(got - plain).max() > 1e-4 * scale


def test_generate_with_int8_weights(capsys, monkeypatch, checkpoint):
    """``generate --weights int8`` hands the format to compile_causal_lm; the tokens are the
    greedy ones of the model whose dense weights are their int8 values."""
    from scanweaver_tvm import causal_lm

    path, model = checkpoint
    asked, build = [], causal_lm.compile_causal_lm
    monkeypatch.setattr(causal_lm, "compile_causal_lm", lambda *a, **k: asked.append(k.get("weights")) or build(*a, **k))
    ids = [5, 17, 3, 40, 22, 9]
    code, out, err = run(capsys, "generate", path, "--prompt-ids", ",".join(map(str, ids)), "--max-new-tokens", "5",
                         "--weights", "int8", "-q")
    assert code == 0, err
    assert asked == ["int8"]
    prompt = torch.tensor([ids])
    with torch.no_grad(), torch_kernels():
        want = quantized_copy(model, weight_format("int8")).generate(
            prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=5)[0, len(ids):]
    assert len(set(want.tolist())) > 1                     # (a model that repeats one token proves little)
    assert out.splitlines()[0] == " ".join(map(str, want.tolist()))


def test_show_tir_prints_the_scan_primfunc(capsys, tiny):
    code, out, _ = run(capsys, "show-tir", f"{tiny}:decay", "-q")
    assert code == 0
    assert "@T.prim_func" in out and "def scanweaver_scan" in out
    code, out, _ = run(capsys, "show-tir", f"{tiny}:decay", "-q", "--target", "cuda", "--arch", "sm_80")
    assert code == 0
    assert "def scanweaver_scan" in out and "threadIdx" in out and "cuda (sm_80)" in out


def test_show_tir_without_a_recurrence_says_so(capsys, tiny):
    code, out, _ = run(capsys, "show-tir", f"{tiny}:tanh_rnn", "-q")
    assert code == 0
    assert "no scan" in out and "report" in out


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_compile_cuda_checks_with_nvcc_and_exports(capsys, tmp_path):
    out_path = tmp_path / "ema_cuda.so"
    code, out, err = run(capsys, "compile", EMA, "--length", "8", "--target", "cuda", "-o", out_path)
    assert code == 0, err
    assert "checked with nvcc + ptxas for sm_90" in out
    assert b"__global__" in out_path.read_bytes()                   # the kernels travel as CUDA C
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ema_cuda.so"]


def test_cuda_without_nvcc_is_a_clear_error(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    out_path = tmp_path / "x.so"
    code, _, err = run(capsys, "compile", EMA, "--target", "cuda", "-o", out_path, "-q")
    assert_one_line_error(code, err, "nvcc is not on PATH", "--no-nvcc-check")
    assert not out_path.exists()


def test_mlir_without_its_tools_is_a_clear_error(capsys, tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("SCANWEAVER_MLIR_BIN", str(tmp_path / "empty"))
    out_path = tmp_path / "x.so"
    code, _, err = run(capsys, "compile", EMA, "--length", "4", "--realization", "mlir", "-o", out_path, "-q")
    assert_one_line_error(code, err, "--realization mlir", "mlir-opt", "apt-get install mlir-22-tools")
    code, _, err = run(capsys, "mlir", EMA, "--length", "4", "-q")
    assert_one_line_error(code, err, "mlir-opt", "mlir-22-tools")
    assert not out_path.exists()


def test_mlir_prints_every_stage_and_the_ptx(capsys):
    code, out, _ = run(capsys, "mlir", EMA, "--length", "8", "-q")
    assert code == 0
    stages = [line.split()[-1] for line in out.splitlines() if line.startswith("// ----- stage ")]
    assert stages == ["scanweaver.scan", "affine_scan", "assoc_scan", "blelloch", "gpu", "cpu", "llvm"]
    for op in ('"scanweaver.scan"', '"scanweaver.affine_scan"', '"scanweaver.assoc_scan"',
               '"scanweaver.blelloch_up"', "gpu.barrier", "define i32 @scanweaver_mlir_"):
        assert op in out, op
    code, out, _ = run(capsys, "mlir", EMA, "--length", "8", "-q", "--stage", "ptx")
    assert code == 0
    assert ".entry scanweaver_affine_scan_" in out and "bar.sync" in out
    assert "registers" in out and "spills 0 B stored / 0 B loaded" in out


def test_compile_with_the_mlir_realization_runs_like_torch(capsys, tmp_path):
    import tvm
    from tvm import relax

    from scanweaver_tvm import models

    out_path = tmp_path / "ema_mlir.so"
    code, out, err = run(capsys, "compile", EMA, "--length", "8", "--realization", "mlir", "-o", out_path, "-q")
    assert code == 0, err
    assert "1 scan (mlir)" in out
    model, args = models.ema(length=8)
    with torch.no_grad():
        expected = model(*args)
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(out_path)), tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(a.numpy()) for a in args])
    np.testing.assert_allclose(got.numpy() if hasattr(got, "numpy") else got[0].numpy(),
                               (expected if isinstance(expected, torch.Tensor) else expected[0]).numpy(),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("argv,fragments", [
    (["report", "missing.onnx"], ["model file not found: missing.onnx"]),
    (["report", "missing.py:make"], ["model file not found: missing.py"]),
    (["report", "no_such_thing"], ["not an existing .onnx file"]),
    (["report", "scanweaver_tvm.models:1bad"], ["must be a Python name"]),
    (["report", "model.py"], ["name the factory"]),
    (["report", "scanweaver_tvm.models:nope"], ["has no 'nope'"]),
    (["report", "no_such_package.models:ema"], ["cannot import module 'no_such_package.models'"]),
    (["report", "{tiny}:broken"], ["raised RuntimeError: the factory fell over"]),
    (["report", "{tiny}:not_a_pair"], ["must return (torch model, example inputs)"]),
    (["report", "{tiny}:no_length", "--length", "4"], ["takes no 'length' keyword"]),
    (["report", "{onnx}", "--length", "4"], ["--length applies to factory MODELs only"]),
    (["report", "{onnx}"], ["cannot import", "ONNX model"]),
    (["report", "{tmp}"], ["is a directory without config.json", "not a transformers checkpoint"]),
    (["compile", EMA, "--weights", "int3", "-o", "{out}"], ["--weights", "unknown weight format 'int3'", ", ".join(NAMES)]),
    (["generate", "{tmp}", "--prompt-ids", "1,2", "--weights", "q4_0"], ["unknown weight format 'q4_0'", "int4_asym_g32"]),
    (["generate", "{tmp}", "--prompt", "To be"], ["no tokenizer to read --prompt with", "--prompt-ids"]),
    (["generate", "{tmp}", "--prompt", "To be", "--prompt-ids", "1"], ["not allowed with argument"]),
    (["report", EMA, "--length", "0"], ["positive integer"]),
    (["compile", EMA, "--realization", "sycl", "-o", "{out}"], ["invalid choice: 'sycl'"]),
    (["compile", EMA, "--target", "rocm", "-o", "{out}"], ["--target 'rocm'"]),
    (["compile", EMA, "--arch", "sm_90", "-o", "{out}"], ["--arch applies to CUDA targets only"]),
    (["compile", EMA, "-o", "{tmp}/no/such/dir/x.so"], ["does not exist"]),
    (["compile", EMA], ["required", "-o/--output"]),
    (["frobnicate", EMA], ["invalid choice: 'frobnicate'"]),
])
def test_errors_are_one_line_with_status_2(capsys, tmp_path, tiny, argv, fragments):
    bad_onnx = tmp_path / "truncated.onnx"
    bad_onnx.write_bytes(b"\x08\x07\x12\x04oops")
    out = tmp_path / "out.so"
    argv = [a.format(tiny=tiny, onnx=bad_onnx, out=out, tmp=tmp_path) for a in argv]
    code, stdout, err = run(capsys, *argv, "-q")
    assert_one_line_error(code, err, *fragments)
    assert stdout == ""
    assert not out.exists()
    left = sorted(p.name for p in tmp_path.iterdir() if p.name != "__pycache__")
    assert left == ["tiny_models.py", "truncated.onnx"]


def test_error_after_progress_is_still_one_error_line(capsys, tiny):
    code, _, err = run(capsys, "report", f"{tiny}:broken")
    assert code == 2 and "Traceback" not in err
    lines = err.splitlines()
    assert lines[-1].startswith("scanweaver-tvm: error: ") and "the factory fell over" in lines[-1]
    assert [line for line in lines if "scanweaver-tvm: error" in line] == lines[-1:]
    assert "failed after" in lines[-2]


def test_failed_export_leaves_no_file_and_keeps_the_old_one(capsys, tmp_path, monkeypatch):
    from scanweaver_tvm import api

    class HalfWritten:
        def export_library(self, path):
            Path(path).write_bytes(b"half a library")
            raise OSError("disk full")

    monkeypatch.setattr(api, "compile", lambda *a, **k: HalfWritten())
    out_path = tmp_path / "model.so"
    out_path.write_bytes(b"the previous library")
    code, _, err = run(capsys, "compile", EMA, "--length", "4", "-o", out_path, "-q")
    assert_one_line_error(code, err, "cannot write", "disk full")
    assert out_path.read_bytes() == b"the previous library"
    assert [p.name for p in tmp_path.iterdir()] == ["model.so"]


def test_installed_console_script(tmp_path):
    script = SCRIPT if SCRIPT.exists() else shutil.which("scanweaver-tvm")
    assert script, "console script scanweaver-tvm not installed (pip install -e .)"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([str(script), "report", EMA, "--length", "4"], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "L=4" in proc.stdout and "axis=1" in proc.stdout and "affine" in proc.stdout
    assert "importing scanweaver_tvm.models:ema ... done in" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = subprocess.run([str(script), "compile", "missing.onnx", "-o", "x.so"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr == "scanweaver-tvm: error: model file not found: missing.onnx\n"
    assert not (tmp_path / "x.so").exists()
