"""Tensor-parallel shards (``compile_causal_lm(model, tensor_parallel=(rank, world))``): each
rule's mixers split over two ranks (threads of this process; Mamba by inner channel, Mamba-2 by
head, its B and C split by group or kept whole), each shard's scans still fused.  Every rank's
logits are the whole model's and the bytes each rank reduces the cost model's; over two gloo
ranks, the documented command's tokens are transformers'."""
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers

import scanweaver_tvm as sw
from scanweaver_tvm import tensor_parallel
from scanweaver_tvm.causal_lm import torch_kernels
from scanweaver_tvm.sequence_parallel import collective, cost
from test_causal_lm import tiny_mamba
from test_chunked_forms import FAMILIES

WORLD = 2


def tiny_mamba2(groups):
    torch.manual_seed(0)
    cfg = transformers.Mamba2Config(vocab_size=96, hidden_size=64, state_size=16, num_hidden_layers=2, expand=2,
                                    head_dim=16, num_heads=8, n_groups=groups, conv_kernel=4, chunk_size=8)
    return transformers.Mamba2ForCausalLM(cfg).eval()


def tiny_bamba():
    """Bamba: Mamba-2 mixers (one group: the gated norm reduced), attention (its heads and a
    rank's paged cache split) and gated MLPs, every one sharded."""
    return FAMILIES["bamba"][0]().eval()


def _mamba_widths(cfg):
    return [[cfg.time_step_rank + 2 * cfg.state_size, cfg.hidden_size]] * cfg.num_hidden_layers


def _bamba_widths(cfg):
    """Per layer: attention's o_proj or the mixer's out_proj and norm (one group), the MLP's down."""
    hidden = cfg.hidden_size
    return [[hidden, hidden] if i in cfg.attn_layer_indices else [hidden, 1, hidden]
            for i in range(cfg.num_hidden_layers)]


# name: (model, its scan op, the widths each layer all-reduces per token); Mamba-2 with one
# group (its gated norm reduced too) is the documented command's test below
CASES = {
    "mamba": (tiny_mamba, "scanweaver.selective_scan", _mamba_widths),
    "mamba2_groups_split": (lambda: tiny_mamba2(2), "scanweaver.matrix_scan",
                            lambda cfg: [[cfg.hidden_size]] * cfg.num_hidden_layers),
    "bamba": (tiny_bamba, "scanweaver.matrix_scan", _bamba_widths),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_shards_over_two_ranks_compute_the_whole_models_logits(case):
    """Each rank's prefill logits are the whole model's (the shards built in their ranks'
    threads, at once), with the bytes the cost model counts; a hybrid's ranks then generate
    transformers' tokens, each decoding from its own paged cache (its share of the key/value
    heads)."""
    make, op, widths = CASES[case]
    model = make()
    shards = [sw.compile_causal_lm(model, tensor_parallel=(rank, WORLD)) for rank in range(WORLD)]
    ids = torch.randint(0, 64, (1, 23), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).logits[:, -1].numpy()
    traffic = [collective.Traffic() for _ in range(WORLD)]
    logits = collective.in_threads(WORLD, lambda rank: shards[rank].prefill(ids.numpy())[0].numpy(),
                                   traffic=traffic)
    mixers = sum(1 for m in model.modules() if type(m).__name__ in ("MambaMixer", "Mamba2Mixer", "BambaMixer"))
    assert shards[0].module()["prefill"].script(show_meta=False).count(op) == mixers   # (built in the threads)
    for got in logits:
        assert np.abs(got - want).max() <= 1e-4 * max(np.abs(want).max(), 1.0)
    per_layer = widths(model.config)
    assert [(t.calls, t.bytes_sent) for t in traffic] == \
        [(sum(map(len, per_layer)), 23 * cost.tensor_parallel_bytes(per_layer))] * WORLD
    if shards[0].layout.grows:
        paged = shards[0].layout.paged
        assert (paged.q_heads, paged.kv_heads) == (model.config.num_attention_heads // WORLD,
                                                   model.config.num_key_value_heads // WORLD)
        with torch.no_grad(), torch_kernels():
            expected = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=6)
        tokens = collective.in_threads(WORLD, lambda rank: shards[rank].generate(ids.numpy(), max_new_tokens=6))
        for got in tokens:
            assert np.array_equal(np.asarray(got), expected.numpy())


def _qwen(cls, config, **extra):
    """A tiny Qwen3.5 / Qwen3-Next with two key/value heads and two key heads (they split)."""
    return cls(config(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
                      linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                      linear_conv_kernel_dim=4, layer_types=["linear_attention", "full_attention"], **extra))


T = transformers
# family: (model, the classes its shard splits)
HYBRIDS = {
    "granitemoehybrid": (FAMILIES["granitemoehybrid"][0],
                         {"GraniteMoeHybridMambaLayer", "GraniteMoeHybridAttention", "GraniteMoeHybridMLP"}),
    "nemotron_h": (FAMILIES["nemotron_h"][0], {"NemotronHMamba2Mixer", "NemotronHAttention", "NemotronHMLP"}),
    "zamba2": (FAMILIES["zamba2"][0], {"Zamba2MambaMixer"}),
    "qwen3_5": (lambda: _qwen(T.Qwen3_5ForCausalLM, T.Qwen3_5TextConfig),
                {"Qwen3_5GatedDeltaNet", "Qwen3_5Attention", "Qwen3_5MLP"}),
    "qwen3_next": (lambda: _qwen(T.Qwen3NextForCausalLM, T.Qwen3NextConfig, num_experts=4, num_experts_per_tok=2,
                                 moe_intermediate_size=32, shared_expert_intermediate_size=32),
                   {"Qwen3NextGatedDeltaNet", "Qwen3NextAttention", "Qwen3NextMLP"}),   # (MLP: the shared expert)
}


@pytest.mark.parametrize("family", sorted(HYBRIDS))
def test_each_hybrid_rule_shards_compute_the_whole_model_in_torch(family):
    """The other hybrids' rules (their mixers, attention and MLP classes), checked where they
    are defined: the shards, run in torch over two ranks' threads, give the whole model's
    logits; the compiled path of a shard is Bamba's above."""
    torch.manual_seed(0)
    make, classes = HYBRIDS[family]
    model = make().eval()
    shards = [tensor_parallel.shard(model, rank, WORLD) for rank in range(WORLD)]
    assert {type(m).__name__ for m in model.modules()} & set(tensor_parallel.RULES) == classes
    ids = torch.randint(0, 64, (1, 23), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), torch_kernels():
        want = model(ids).logits[:, -1].numpy()
        logits = collective.in_threads(WORLD, lambda rank: shards[rank](ids).logits[:, -1].detach().numpy())
    for got in logits:
        assert np.abs(got - want).max() <= 1e-5 * max(np.abs(want).max(), 1.0)


def test_the_documented_command_shards_a_checkpoint_over_two_gloo_ranks(tmp_path):
    """``torchrun ... generate CHECKPOINT --tensor-parallel`` on a Mamba-2 (one group: its norm
    reduced too): each rank its shard, the all-reduces over gloo, every rank generating; the
    last rank's tokens equal transformers'; a deadlock fails at the timeout."""
    tiny_mamba2(1).save_pretrained(tmp_path)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}",
           "-m", "scanweaver_tvm.sequence_parallel.generate", str(tmp_path), "--length", "19", "--new", "8",
           "--tensor-parallel"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=400, check=False)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"the ranks did not finish in {err.timeout} s (a deadlock?)")
    want = f"sharded over {WORLD} ranks, 8 tokens generated on rank {WORLD - 1}: equal to one process"
    assert done.returncode == 0 and want in done.stdout, (done.stdout + done.stderr)[-3000:]


def test_what_is_not_sharded_is_refused_by_name():
    torch.manual_seed(0)
    cfg = transformers.FalconH1Config(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, mamba_d_ssm=128, head_dim=16,
                                      mamba_n_groups=1)
    with pytest.raises(NotImplementedError, match="FalconH1Mixer"):
        sw.compile_causal_lm(transformers.FalconH1ForCausalLM(cfg).eval(), tensor_parallel=(0, 2))
    with pytest.raises(ValueError, match="64 inner channels do not split over 3 ranks"):
        sw.compile_causal_lm(tiny_mamba(), tensor_parallel=(0, 3))
    with pytest.raises(ValueError, match="8 heads in 2 groups do not split over 4 ranks"):
        sw.compile_causal_lm(tiny_mamba2(2), tensor_parallel=(0, 4))
    with pytest.raises(ValueError, match="0 <= rank < world"):
        sw.compile_causal_lm(tiny_mamba(), tensor_parallel=(2, 2))
    with pytest.raises(NotImplementedError, match="one or the other"):
        sw.compile_causal_lm(tiny_mamba(), ranks=2, tensor_parallel=(0, 2))
