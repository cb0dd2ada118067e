"""Tensor-parallel shards (``compile_causal_lm(model, tensor_parallel=(rank, world))``): a
Mamba's mixers split by inner channel over two ranks (threads of this process), each shard's
scans still fused, an all-reduce after ``x_proj`` and ``out_proj``.  Every rank's logits are the
whole model's, its tokens transformers', and the bytes each rank reduces are the cost model's."""
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers

import scanweaver_tvm as sw
from scanweaver_tvm.sequence_parallel import collective, cost
from test_causal_lm import tiny_mamba

WORLD = 2


def test_a_mamba_sharded_over_two_ranks_computes_the_whole_models_logits_and_tokens():
    model = tiny_mamba()
    shards = [sw.compile_causal_lm(model, tensor_parallel=(rank, WORLD)) for rank in range(WORLD)]
    prefill = shards[0].module()["prefill"].script(show_meta=False)
    assert prefill.count("scanweaver.selective_scan") == 2 and prefill.count("scanweaver.ccl.allreduce") == 4
    ids = torch.randint(0, 96, (1, 23), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).logits[:, -1].numpy()
        tokens = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=8)
    traffic = [collective.Traffic() for _ in range(WORLD)]
    logits = collective.in_threads(WORLD, lambda rank: shards[rank].prefill(ids.numpy())[0].numpy(), traffic=traffic)
    for got in logits:
        assert np.abs(got - want).max() <= 1e-4 * max(np.abs(want).max(), 1.0)
    cfg = model.config
    per_token = cost.tensor_parallel_bytes(cfg.num_hidden_layers, cfg.hidden_size, cfg.time_step_rank,
                                           cfg.state_size)
    assert [(t.calls, t.bytes_sent) for t in traffic] == [(2 * cfg.num_hidden_layers, 23 * per_token)] * WORLD
    for got in collective.in_threads(WORLD, lambda rank: shards[rank].generate(ids, max_new_tokens=8)):
        assert torch.equal(got, tokens)


def test_what_is_not_sharded_is_refused_by_name():
    cfg = transformers.Mamba2Config(vocab_size=96, hidden_size=64, state_size=16, num_hidden_layers=1, head_dim=16,
                                    num_heads=8, n_groups=1, conv_kernel=4, chunk_size=8)
    with pytest.raises(NotImplementedError, match="Mamba2Mixer"):
        sw.compile_causal_lm(transformers.Mamba2ForCausalLM(cfg).eval(), tensor_parallel=(0, 2))
    with pytest.raises(ValueError, match="64 inner channels do not split over 3 ranks"):
        sw.compile_causal_lm(tiny_mamba(), tensor_parallel=(0, 3))
    with pytest.raises(ValueError, match="0 <= rank < world"):
        sw.compile_causal_lm(tiny_mamba(), tensor_parallel=(2, 2))
    with pytest.raises(NotImplementedError, match="one or the other"):
        sw.compile_causal_lm(tiny_mamba(), ranks=2, tensor_parallel=(0, 2))


def test_the_documented_command_shards_a_checkpoint_over_two_gloo_ranks(tmp_path):
    """``torchrun ... generate CHECKPOINT --tensor-parallel``: each rank its shard, the
    all-reduces over gloo; the last rank's tokens equal transformers'; a deadlock fails at the
    timeout."""
    tiny_mamba().save_pretrained(tmp_path)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}",
           "-m", "scanweaver_tvm.sequence_parallel.generate", str(tmp_path), "--length", "19", "--new", "6",
           "--tensor-parallel"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=400, check=False)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"the ranks did not finish in {err.timeout} s (a deadlock?)")
    want = f"sharded over {WORLD} ranks, 6 tokens generated on rank {WORLD - 1}: equal to one process"
    assert done.returncode == 0 and want in done.stdout, (done.stdout + done.stderr)[-3000:]
