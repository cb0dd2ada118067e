"""The GPU check's artifacts (bench/gpu/prepare.py), made here for bench/gpu/run_gpu_check.py
to launch on a GPU machine: every manifest names kernels that exist in its CUDA source, with
arguments that are its buffers."""
import json

from bench.gpu import prepare


def test_prepare_quick_writes_consistent_manifests(tmp_path):
    prepare.main(["--quick", "--out", str(tmp_path)])
    manifests = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("*.json"))]
    assert {m["config"]["realization"] for m in manifests} == {"warp", "chunked", "blelloch", "selective_gpu",
                                                               "matrix_gpu", "mlir"}
    # Mamba-1 as a matrix scan (SelectiveScanSpec.as_matrix) runs on the selective buffers
    by_name = {m["name"]: m for m in manifests}
    ours, theirs = by_name["selective_matrix_gpu_1x64x256x16"], by_name["selective_1x64x256x16"]
    assert ours["kind"] == "selective" and ours["spec"] == theirs["spec"]
    def by_buffer(m):
        return sorted(m["buffers"], key=lambda b: b["name"])

    assert by_buffer(ours) == by_buffer(theirs)
    for m in manifests:
        source = (tmp_path / m["source"]).read_text()
        names = {b["name"] for b in m["buffers"]}
        assert m["format"] == "scanweaver-gpu/1" and m["launches"]
        for launch in m["launches"]:
            if m["source"].endswith(".ptx"):           # MLIR: PTX, launched by the same runner
                signature = source.split(f".visible .entry {launch['kernel']}(", 1)[1].split(")", 1)[0]
                assert signature.count(".param") == len(launch["args"])
            else:
                assert f"void __launch_bounds__({launch['block'][0]}) {launch['kernel']}(" in source
            assert set(launch["args"]) <= names
            assert launch["grid"][0] >= 1
