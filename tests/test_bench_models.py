"""bench.models' peers and timing: OpenVINO's runner checks its output against PyTorch's, the
best peer leaves out a peer that missed its check, and the interleaved timer times a path
too slow to repeat once."""
import json
import time

import numpy as np
import pytest
import torch

from bench import models, models_runners, models_timing


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(50, 8)
        self.out = torch.nn.Linear(8, 5)

    def forward(self, ids):
        return torch.cumsum(self.out(self.emb(ids)), dim=1)


def test_openvino_runner_checks_against_pytorch():
    pytest.importorskip("openvino")
    model, ids = _Tiny().eval(), torch.randint(0, 50, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = [model(ids).numpy()]
    res, run = models_runners.openvino_runner(model, [ids], want)
    assert run is not None and res["ok"] and res["rel_err"] <= 1e-6, res
    assert res["precision"] == "<Type: 'float32'>" and res["threads"] == models.THREADS
    np.testing.assert_allclose(run()[0], want[0], rtol=1e-5, atol=1e-6)
    wrong, _ = models_runners.openvino_runner(model, [ids], [want[0] + 1.0])
    assert not wrong["ok"] and wrong["rel_err"] > 1e-2


def test_best_peer_leaves_out_a_peer_that_missed_its_check():
    row = {"with": {"run": {"ms": 2.0}}, "eager": {"run": {"ms": 10.0}},
           "openvino": {"run": {"ms": 4.0}, "ok": True}}
    assert models.best_peer(row) == ("openvino", 4.0)
    assert models.ratios(row)["vs best peer"] == 2.0
    row["openvino"]["ok"] = False
    assert models.best_peer(row) == ("eager", 10.0)


def test_interleaved_times_every_path_and_a_slow_one_once():
    calls = {"fast": 0, "slow": 0}

    def fast():
        calls["fast"] += 1

    def slow():
        calls["slow"] += 1
        time.sleep(0.06)

    got = models_timing.interleaved({"fast": fast, "slow": slow}, budget_s=0.05, max_rounds=5)
    assert got["slow"]["n"] == 1 and calls["slow"] == 1 and got["slow"]["ms"] >= 60
    assert 3 <= got["fast"]["n"] <= 5 and calls["fast"] == 1 + got["fast"]["n"] * got["fast"]["number"]


def test_precision_bench_writes_its_table(tmp_path):
    """``bench.precision`` on a tiny shape: both precisions timed for ours and PyTorch's, the
    table written with the CPU and our bf16 path named."""
    from bench import precision

    assert precision.main(["--shapes", "3x16x32", "--rounds", "2", "--repeat", "1", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "precision.md").read_text()
    assert "| 3x16x32 |" in table and "our bf16 path:" in table
    result = json.loads((tmp_path / "precision.json").read_text())
    assert {r["dtype"] for r in result["rows"]} == {"float32", "bfloat16"}
    assert all(len(r["seconds"]["ours"]) == 2 and len(r["seconds"]["eager"]) == 2 for r in result["rows"])


def test_generate_bench_times_every_peer_in_the_same_rounds(tmp_path):
    """``bench.generate --dtype bfloat16`` on a tiny Mamba: ours, transformers, our float32 build
    of the same weights and OpenVINO's first token (default precision and f32) each timed in
    every round, and the table's rows and ratios written."""
    from bench import generate

    rc = generate.main(["--dtype", "bfloat16", "--layers", "1", "--hidden", "32", "--vocab", "96", "--prompt", "9",
                        "--new", "3", "--rounds", "2", "--scaling", "", "--out", str(tmp_path)])
    assert rc == 0
    result = json.loads((tmp_path / "generate_bfloat16.json").read_text())
    for key in ("ours_ttft", "ours_decode", "hf_ttft", "ours_f32_ttft", "ours_f32_decode",
                "openvino_default_ttft", "openvino_f32_ttft"):
        assert len(result["rounds"][key]) == 2, key
    table = (tmp_path / "generate_bfloat16.md").read_text()
    assert "| ours, float32 weights |" in table and "OpenVINO f32, first token only" in table
    assert "x our float32 build's" in table and "faster than OpenVINO's default" in table


def test_prefill_kernel_split_names_each_kernels_kind():
    """``bench.prefill_kernels``: kernels put in kinds by the names TVM gives fused functions,
    and a tiny Mamba's prefill timed call by call: its dense layers' FLOPs counted (2 M N K of
    each matmul), its scan and VM calls found, the kind table's shares summing to the whole."""
    import torch
    import transformers

    import scanweaver_tvm as sw
    from bench import prefill_kernels as pk

    assert pk.kind_of("fused_matmul13_cast51_weights_prepacked") == "dense"
    assert pk.kind_of("fused_transpose21_cast45") == "layout"
    assert pk.kind_of("fused_cast52_tir_sigmoid8_multiply36_cast53_multiply37") == "elementwise"
    assert pk.kind_of("fused_mean5_add18_tir_rsqrt7_multiply33") == "norm"
    assert pk.kind_of("vm.builtin.alloc_tensor") == "vm" and pk.kind_of("scanweaver_scan") == "scan"
    torch.manual_seed(0)
    config = transformers.MambaConfig(vocab_size=96, hidden_size=32, state_size=8, num_hidden_layers=1, expand=2)
    lm = sw.compile_causal_lm(transformers.MambaForCausalLM(config).eval())
    ids = torch.randint(0, 96, (1, 20))
    split = pk.kernel_split(lm._build(1)[1], lambda: lm.prefill(ids.numpy()))   # pylint: disable=protected-access
    kinds = {pk.kind_of(name) for name in split}
    assert {"dense", "scan", "vm"} <= kinds, split
    in_proj = 2 * 20 * 32 * 128                         # (L x hidden) @ (hidden x 2 d_inner)
    assert sum(f for name, (_, _, _, f) in split.items() if pk.kind_of(name) == "dense") >= in_proj
    table, total = pk.kind_table({"kernels": split, "dense_roof_GFLOPs": 100.0, "copy_GBps": 10.0})
    shares = [int(line.split("|")[3].strip().rstrip("%")) for line in table[2:] if line.startswith("| ")]
    assert total > 0 and 97 <= sum(shares) <= 103, table
