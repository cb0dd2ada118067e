"""Hardware features of a target: the head sees them next to the rolled-out latent.

CPU: cores, SIMD width (AVX-512 / AVX2 / SSE from the LLVM target's features), L1d/L2/L3
sizes (from /sys for the host).  CUDA: SMs, max threads per block, warp size, shared memory per
block, L2 size.  One machine's data makes these constant during training (they cannot help
ranking there); they are in the model so records from other machines can share it.
"""
import math
import os

import numpy as np
import tvm

HW_DIM = 7


def _lg(x):
    return math.log2(1.0 + float(x)) / 20.0


def _host_cache_bytes(level_types):
    root = "/sys/devices/system/cpu/cpu0/cache"
    sizes = {}
    try:
        for entry in sorted(os.listdir(root)):
            path = os.path.join(root, entry)
            with open(os.path.join(path, "level")) as f:
                level = int(f.read())
            with open(os.path.join(path, "type")) as f:
                kind = f.read().strip()
            with open(os.path.join(path, "size")) as f:
                text = f.read().strip()
            size = int(text[:-1]) * 1024 if text.endswith("K") else int(text[:-1]) << 20 if text.endswith("M") else int(text)
            if (level, kind) in level_types:
                sizes[level] = size
    except (OSError, ValueError):
        pass
    return [sizes.get(level, 0) for level, _ in level_types]


def _simd_bits(target):
    from tvm.target import codegen
    for feature, bits in (("avx512f", 512), ("avx2", 256), ("sse2", 128), ("neon", 128)):
        try:
            if codegen.target_has_features(feature, target):
                return bits
        except Exception:  # features unknown for this target
            return 128
    return 64


def encode_hardware(target):
    """``float32[HW_DIM]`` for a ``tvm.target.Target`` (llvm or cuda)."""
    target = tvm.target.Target(target)
    attrs = target.attrs
    if target.kind.name == "cuda":
        arch = str(attrs.get("arch", "sm_80"))
        sms = {"sm_90": 132, "sm_89": 128, "sm_86": 84, "sm_80": 108, "sm_75": 72, "sm_70": 80}.get(arch, 80)
        vec = [1.0, _lg(sms), _lg(attrs.get("max_num_threads", 1024)),
               _lg(attrs.get("thread_warp_size", 32)),
               _lg(attrs.get("max_shared_memory_per_block", 48 * 1024)),
               _lg(attrs.get("l2_cache_size_bytes", 40 << 20)), int(arch.split("_")[-1]) / 100.0]
    else:
        cores = int(attrs.get("num-cores", os.cpu_count() or 1))
        l1, l2, l3 = _host_cache_bytes([(1, "Data"), (2, "Unified"), (3, "Unified")])
        vec = [0.0, _lg(cores), _simd_bits(target) / 512.0, _lg(l1), _lg(l2), _lg(l3), 0.0]
    return np.asarray(vec, dtype=np.float32)
