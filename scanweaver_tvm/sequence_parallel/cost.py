"""The cost model of a sequence-parallel scan layer, on paper: what each rank sends, what the
fold computes, and how long the exchange takes on a given link, next to the two other ways of
splitting a sequence (Megatron-LM's all-to-all of activations; LASP-1's state passed rank to
rank).  ``summary_bytes`` is written from the specs' definitions, apart from the module that
packs the summaries, and a test holds the two equal."""
import math
from dataclasses import dataclass

from scanweaver_core.spec import (AffineScanSpec, DeltaScanSpec, MatrixScanSpec, MLSTMScanSpec, SelectiveScanSpec,
                                  StabilizedScanSpec)

F32 = 4


def summary_entries(spec):
    """``(transition, state)``: float32 entries of a part's summary, independent of its length.

    - affine, ``h = a h + b``: a state per lane, a transition per lane ``a`` varies over;
    - selective (Mamba-1): ``B * D * N`` each (the transition ``exp(A * sum dt)`` per entry);
    - matrix: the state ``B * H * K * V``; the transition one per (B, H) under a scalar decay
      (Mamba-2), K or V under a per-key or per-value one, K * V under Mamba-1's selective one,
      none without a decay;
    - stabilized (RWKV's WKV): ``num`` (with values), ``den``, ``max`` per (B, C), and the
      summed log decay unless there is none;
    - mLSTM: ``C`` (K x V), ``n`` (K, normalized), ``m`` per (B, H), and the summed log forget;
    - delta rules and DPLR: a K x K transition and the K x V state per (B, H)."""
    if isinstance(spec, AffineScanSpec):
        varies = spec.a_shape[:spec.axis] + spec.a_shape[spec.axis + 1:]
        return math.prod(varies), spec.lanes
    if isinstance(spec, SelectiveScanSpec):
        n = spec.batch * spec.dim * spec.dstate
        return n, n
    if isinstance(spec, MatrixScanSpec):
        heads = spec.batch * spec.heads
        per_head = {"none": 0, "scalar": 1, "key": spec.key, "value": spec.value, "selective": spec.key * spec.value}
        return heads * per_head[spec.decay], heads * spec.key * spec.value
    if isinstance(spec, StabilizedScanSpec):
        lanes = spec.batch * spec.channels
        return (0 if spec.decay == "none" else lanes), lanes * ((1 if spec.has_values else 0) + 2)
    if isinstance(spec, MLSTMScanSpec):
        heads = spec.batch * spec.heads
        return heads, heads * (spec.key * spec.value + (spec.key if spec.normalized else 0) + 1)
    if isinstance(spec, DeltaScanSpec):
        heads = spec.batch * spec.heads
        return heads * spec.key * spec.key, heads * spec.key * spec.value
    raise TypeError(f"not a scan spec: {type(spec).__name__}")


def summary_bytes(spec):
    """Bytes one rank contributes to the layer's one all-gather (``summary_entries``, float32):
    GDN with B = 1, H = 16, K = V = 128 sends 2 MiB, whatever the prompt's length."""
    return F32 * sum(summary_entries(spec))


def fold_flops(spec, ranks):
    """Floating-point operations a rank spends folding all ``ranks`` summaries (the final
    state too): per part, a multiply-add per state entry (linear forms), two exponentials and
    a multiply-add per entry (log-space forms), a K x K by K x V product (delta rules)."""
    transition, state = summary_entries(spec)
    if isinstance(spec, DeltaScanSpec):
        return ranks * 2 * transition * spec.value
    per_entry = 4 if isinstance(spec, (StabilizedScanSpec, MLSTMScanSpec)) else 2
    return ranks * per_entry * state


def attention_bytes(batch, longest, kv_heads, key_dim, value_dim, itemsize=F32):
    """Bytes one rank contributes to an attention layer's all-gather (``relax_pass.split.
    attention``): its part's keys and values padded to the longest part's ``longest`` rows.
    Unlike a scan's summary it grows with the prompt (``L / P`` rows); ring attention sends the
    same blocks, one hop at a time.  The parts' lengths (8 bytes a rank) go once a prefill."""
    return batch * longest * kv_heads * (key_dim + value_dim) * itemsize


def tensor_parallel_bytes(layer_widths, itemsize=F32):
    """Bytes a rank all-reduces per token of a model sharded by channel and head
    (``tensor_parallel``): for each layer, the widths of its reductions: Mamba's ``x_proj``
    (``dt_rank + 2 N``: dt, B and C) and ``out_proj`` (``hidden``); Mamba-2's ``out_proj``, and
    with one group its gated norm's sum of squares (1); attention's ``o_proj`` and an MLP's
    down projection (``hidden`` each).  Unlike sequence parallelism's all-gather, it grows
    with the tokens, prefill and decode alike."""
    return sum(sum(widths) for widths in layer_widths) * itemsize


@dataclass(frozen=True)
class Link:
    """An interconnect: bandwidth per direction (bytes/s) and latency per message (s)."""

    name: str
    bandwidth: float
    latency: float


# NVIDIA's figures: H100 NVLink 4 (900 GB/s total, 450 GB/s a direction); NDR InfiniBand
# (400 Gb/s = 50 GB/s a port).  Latencies are the usual order of magnitude for NCCL
# small-message collectives (a few microseconds in a node, ~10 across nodes).
LINKS = (Link("NVLink 4 (H100, in a node)", 450e9, 3e-6), Link("InfiniBand NDR (across nodes)", 50e9, 10e-6))


def allgather_seconds(payload, ranks, link):
    """A ring all-gather of ``payload`` bytes a rank: ``ranks - 1`` steps, each one message."""
    return (ranks - 1) * (link.latency + payload / link.bandwidth)


def ring_pass_seconds(payload, ranks, link):
    """LASP-1's state passed rank to rank: ``ranks - 1`` dependent hops, each after the
    previous rank's part has finished (so the parts' compute serializes too; not counted): the
    same messages as a ring all-gather."""
    return allgather_seconds(payload, ranks, link)


def all_to_all_seconds(batch, length, width, ranks, link, itemsize=2, exchanges=2):
    """Megatron-LM's context parallelism for Mamba: ``exchanges`` all-to-alls of the layer's
    (B, L, width) activations (bf16 by default), each rank sending ``(ranks - 1) / ranks`` of
    its ``L / ranks`` rows: bytes that grow with L."""
    per_rank = batch * length / ranks * width * itemsize * (ranks - 1) / ranks
    return exchanges * ((ranks - 1) * link.latency + per_rank / link.bandwidth)


def batch_of(spec):
    return spec.shape[0] if isinstance(spec, AffineScanSpec) else spec.batch


def _layers(length):
    """Real layers' scans at ``length`` tokens, batch 1, and the channels Megatron's all-to-all
    moves for each (the mixer's input width, bf16)."""
    return [
        ("Gated DeltaNet, H = 16, K = V = 128 (the issue's example)",
         DeltaScanSpec(1, 16, length, 128, 128, decay="head"), 16 * 128),
        ("Mamba-2 2.7B: 80 heads x 64, N = 128", MatrixScanSpec.create(1, 80, length, 128, 64, decay="scalar"), 5120),
        ("Mamba 2.8B: D = 5120, N = 16", SelectiveScanSpec(1, 5120, length, 16), 5120),
    ]


def projection_table(length=131072, ranks=(8, 32)):
    """A markdown table: each layer's bytes a rank and exchange time per layer on each link."""
    rows = ["| layer | ranks | link | ours: one all-gather | LASP-1: state rank to rank | "
            "Megatron: 2 all-to-alls of activations |",
            "|---|---|---|---|---|---|"]
    for name, spec, width in _layers(length):
        payload = summary_bytes(spec)
        for count in ranks:
            for link in LINKS:
                moved = 2 * batch_of(spec) * length / count * width * 2 * (count - 1) / count
                rows.append(f"| {name} | {count} | {link.name} | {payload / 2**20:.2f} MiB, "
                            f"{allgather_seconds(payload, count, link) * 1e6:.0f} us | "
                            f"{ring_pass_seconds(payload, count, link) * 1e6:.0f} us + the parts' compute in "
                            f"series | {moved / 2**20:.0f} MiB, "
                            f"{all_to_all_seconds(batch_of(spec), length, width, count, link) * 1e6:.0f} us |")
    return "\n".join(rows)


def attention_table(length=131072, ranks=(8, 32)):
    """A markdown table: a hybrid's attention layer (Qwen3-Next's: 2 key/value heads of 256,
    bf16), bytes a rank and all-gather time per layer on each link."""
    rows = ["| attention layer | ranks | link | ours: one all-gather of K and V | "
            "ring attention: the same blocks, P - 1 hops |", "|---|---|---|---|---|"]
    for count in ranks:
        payload = attention_bytes(1, -(-length // count), 2, 256, 256, itemsize=2)
        for link in LINKS:
            rows.append(f"| Qwen3-Next: 2 kv heads x 256, bf16 | {count} | {link.name} | {payload / 2**20:.0f} MiB, "
                        f"{allgather_seconds(payload, count, link) * 1e6:.0f} us | the same bytes, overlapped with "
                        "the blocks' attention |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(f"Per layer, batch 1, a {131072}-token prompt (``python -m scanweaver_tvm.sequence_parallel.cost``; "
          "computed from the cost model, not measured).\n")
    print(projection_table())
    print("\nA hybrid's attention layers: keys and values grow with the prompt (its part's rows).\n")
    print(attention_table())
