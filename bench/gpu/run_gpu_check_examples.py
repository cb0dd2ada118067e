"""``run_gpu_check.py --example DIR``: hand-written naive kernels with their manifests, the first
thing to run on a new GPU machine (a test of the runner itself) and a worked example of the
manifest format."""
import json
import os

if __package__:             # bench.gpu.run_gpu_check_examples
    from .run_gpu_check_manifest import FORMAT
else:                       # imported by the script run_gpu_check.py: its folder is on sys.path
    from run_gpu_check_manifest import FORMAT


# ---------------------------------------------------------------- example artifacts

EXAMPLE_CU = r"""
extern "C" __global__ void plain_naive(const float* __restrict__ a, const float* __restrict__ b,
                                       float* __restrict__ states, int lanes, int L) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= lanes) return;
  float h = 0.f;
  for (int t = 0; t < L; ++t) { h = fmaf(a[(long)i * L + t], h, b[(long)i * L + t]); states[(long)i * L + t] = h; }
}
extern "C" __global__ void selective_naive(const float* u, const float* delta, const float* A,
    const float* B, const float* C, const float* D, const float* z, const float* bias,
    float* out, int batch, int dim, int L, int N) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= batch * dim) return;
  int bi = i / dim, d = i % dim;
  float h[16] = {0.f};  // N <= 16
  for (int t = 0; t < L; ++t) {
    long k = (long)i * L + t;
    float dt = delta[k] + bias[d];
    dt = dt <= 20.f ? log1pf(expf(dt)) : dt;
    float y = 0.f;
    for (int n = 0; n < N; ++n) {
      long j = ((long)bi * N + n) * L + t;
      h[n] = expf(dt * A[d * N + n]) * h[n] + dt * B[j] * u[k];
      y += C[j] * h[n];
    }
    out[k] = (y + D[d] * u[k]) * z[k] / (1.f + expf(-z[k]));
  }
}
"""


def write_examples(folder, batch=1, dim=1536, length=1024, dstate=16):
    """Hand-written naive kernels (one thread per lane) with their manifests: a test of this
    runner before the TVM preparer exists, and a worked example of the format."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "naive.cu"), "w") as f:
        f.write(EXAMPLE_CU)
    bdl, bnl, lanes = [batch, dim, length], [batch, dstate, length], batch * dim
    buf = lambda name, role, shape: {"name": name, "role": role, "shape": shape, "dtype": "float32"}
    grid = [-(-lanes // 128), 1, 1]
    plain = {
        "format": FORMAT, "name": f"plain_naive_{batch}x{dim}x{length}", "kind": "plain",
        "spec": {"shape": bdl, "a_shape": bdl, "axis": 2, "reverse": False, "has_h0": False,
                 "dtype": "float32", "outputs": ["states"]},
        "source": "naive.cu",
        "buffers": [buf("a", "input", bdl), buf("b", "input", bdl), buf("states", "output", bdl)],
        "launches": [{"kernel": "plain_naive", "grid": grid, "block": [128, 1, 1],
                      "shared_mem_bytes": 0,
                      "args": ["a", "b", "states", {"int32": lanes}, {"int32": length}]}],
    }
    selective = {
        "format": FORMAT, "name": f"selective_naive_{batch}x{dim}x{length}x{dstate}",
        "kind": "selective",
        "spec": {"batch": batch, "dim": dim, "length": length, "dstate": dstate, "groups": 0,
                 "has_D": True, "has_z": True, "has_delta_bias": True, "delta_softplus": True,
                 "has_h0": False, "dtype": "float32", "return_last_state": False},
        "source": "naive.cu",
        "buffers": [buf("u", "input", bdl), buf("delta", "input", bdl),
                    buf("A", "input", [dim, dstate]), buf("B", "input", bnl),
                    buf("C", "input", bnl), buf("D", "input", [dim]), buf("z", "input", bdl),
                    buf("delta_bias", "input", [dim]), buf("out", "output", bdl)],
        "launches": [{"kernel": "selective_naive", "grid": grid, "block": [128, 1, 1],
                      "shared_mem_bytes": 0,
                      "args": ["u", "delta", "A", "B", "C", "D", "z", "delta_bias", "out",
                               {"int32": batch}, {"int32": dim}, {"int32": length},
                               {"int32": dstate}]}],
    }
    for m in (plain, selective):
        with open(os.path.join(folder, m["name"] + ".json"), "w") as f:
            json.dump(m, f, indent=1)
    print(f"wrote naive.cu and 2 manifests to {folder}")
