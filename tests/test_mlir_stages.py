"""MLIR stages: each custom stage verifies under the IRDL dialect, errors quote the IR, tools
are found or reported with the install command."""
import re

import pytest

import mlir_bridge
from mlir_bridge import dialect, tools
from scanweaver_core.spec import AffineScanSpec, SelectiveScanSpec

NAMES = ["scanweaver.scan", "affine_scan", "assoc_scan", "blelloch", "gpu", "cpu", "llvm"]


def test_affine_stage_evolution():
    spec = AffineScanSpec.create((2, None, 3), (2, 1, 3), axis=1, reverse=True, has_h0=True,
                                 dtype="float16", outputs=("states", "last"))
    st = mlir_bridge.stages(spec)
    assert [s.name for s in st] == NAMES
    text = {s.name: s.text for s in st}
    assert '"scanweaver.scan"' in text["scanweaver.scan"] and "reverse = true" in text["scanweaver.scan"]
    assert "scanweaver.affine_scan" in text["affine_scan"] and "(s0 * 3)" in text["affine_scan"]
    assert "scanweaver.assoc_scan" in text["assoc_scan"] and "@scanweaver_combine" in text["assoc_scan"]
    assert "scanweaver.blelloch_up" in text["blelloch"] and "scanweaver.blelloch_down" in text["blelloch"]
    assert "gpu.barrier" in text["gpu"] and "#gpu.address_space<workgroup>" in text["gpu"]
    assert "gpu." not in text["cpu"] and "memref.alloca" in text["cpu"]
    defines = re.findall(r"^define .*$", text["llvm"], re.M)
    assert len(defines) == 1 and "ptr %0, ptr %1, ptr %2, ptr %3, ptr %4, i64 %5" in defines[0]


def test_selective_upper_stages():
    spec = SelectiveScanSpec(2, 4, 31, 8, groups=2, has_D=True, has_z=True, has_h0=True, return_last_state=True)
    from mlir_bridge import stage_affine, stage_assoc, stage_blelloch, stage_scan
    s1 = stage_scan.lower(spec)
    s4 = stage_blelloch.lower(stage_assoc.lower(stage_affine.lower(s1)))
    assert "scanweaver.selective_scan" in s1.text and "math.exp" in s1.text
    assert "scanweaver.discretize" in s4.text and "scanweaver.readout" in s4.text
    assert "scanweaver.blelloch_up" in s4.text


def test_irdl_rejects_a_malformed_stage_and_quotes_it():
    spec = AffineScanSpec.create((2, 7))
    good = mlir_bridge.stages(spec)[1].text
    bad = good.replace("lanes = 2 : i64", 'lanes = "two"')
    assert bad != good
    with pytest.raises(mlir_bridge.MlirError) as err:
        dialect.verify(bad, "affine_scan stage")
    msg = str(err.value)
    assert "expected base attribute 'builtin.integer'" in msg
    line = next(i for i, l in enumerate(bad.splitlines(), 1) if '"two"' in l)
    assert f">{line:5d} | " in msg and '"two"' in msg


def test_missing_tools_say_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("SCANWEAVER_MLIR_BIN", str(tmp_path))
    with pytest.raises(tools.MlirToolsMissing) as err:
        tools.find("mlir-opt")
    assert "mlir-opt" in str(err.value) and "apt-get install mlir-22-tools llvm-22" in str(err.value)
    assert isinstance(err.value, RuntimeError)
    monkeypatch.delenv("SCANWEAVER_MLIR_BIN")
    monkeypatch.setenv("PATH", str(tmp_path))      # the Debian directory is still searched
    assert tools.find("mlir-opt").startswith(tools.DEFAULT_DIR)


def test_wrong_version_is_skipped(tmp_path, monkeypatch):
    fake = tmp_path / "mlir-opt"
    fake.write_text("#!/bin/sh\necho 'LLVM version 17.0.6'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("SCANWEAVER_MLIR_BIN", str(tmp_path))
    with pytest.raises(tools.MlirToolsMissing):
        tools.find("mlir-opt")


def test_selective_stage_evolution():
    spec = SelectiveScanSpec(2, 4, 31, 8, groups=2, has_D=True, has_z=True, has_delta_bias=True,
                             delta_softplus=True, has_h0=True, return_last_state=True, dtype="bfloat16")
    st = mlir_bridge.stages(spec)
    assert [s.name for s in st] == NAMES
    text = {s.name: s.text for s in st}
    assert "scanweaver.selective_scan" in text["scanweaver.scan"] and "delta_softplus = true" in text["scanweaver.scan"]
    assert "scanweaver.discretize" in text["affine_scan"] and "scanweaver.affine_scan" in text["affine_scan"]
    assert "scanweaver.assoc_scan" in text["assoc_scan"] and "scanweaver.blelloch_up" in text["blelloch"]
    gpu = text["gpu"]
    assert "gpu.func @scanweaver_selective_scan" in gpu and "gpu.barrier" in gpu and "math.exp" in gpu
    assert "math.log " in gpu and "arith.maximumf" in gpu and "arith.extf" in gpu and "arith.truncf" in gpu
    assert "known_block_size = array<i32: 16, 1, 1>" in gpu      # 16 threads: one tile of 32 steps
    assert "gpu." not in text["cpu"] and "memref.alloca" in text["cpu"]
    defines = re.findall(r"^define .*$", text["llvm"], re.M)
    assert len(defines) == 1 and ", ".join(f"ptr %{i}" for i in range(11)) + ")" in defines[0]
