"""Whole models prefilled across ranks (``compile_causal_lm(..., ranks=N)``): each rank's part
of the prompt through ``prefill_split`` (its scans and causal convs split, one all-gather each
a layer), the last rank decoding.  Tokens equal to the model generating in one process; a
model the split does not carry is refused at compile time, never served wrong."""
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers

import scanweaver_tvm as sw
from relax_pass.split.sequence import SplitRefused
from scanweaver_core.sequence_parts import split
from scanweaver_tvm.causal_lm import torch_kernels
from scanweaver_tvm.sequence_parallel.collective import in_threads
from test_causal_lm import tiny_mamba
from test_chunked_forms import FAMILIES as MAMBA2_HYBRIDS


def test_a_mamba2_hybrid_checkpoint_prefilled_over_two_ranks_generates_one_processs_tokens(tmp_path):
    """The documented command over two gloo ranks (one thread each) on Bamba (Mamba-2 layers and
    an attention layer: its keys and values all-gathered, the last rank's paged cache loaded
    with the whole prompt's), a 51-token prompt (parts of 26 and 25: they cut the chunked
    scan's chunks of 8), 8 new tokens, against the same model in one process; a deadlock
    fails at the timeout."""
    ranks = 2
    torch.manual_seed(0)
    MAMBA2_HYBRIDS["bamba"][0]().save_pretrained(tmp_path)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
           "-m", "scanweaver_tvm.sequence_parallel.generate", str(tmp_path), "--length", "51", "--new", "8"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=400, check=False)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"the ranks did not finish in {err.timeout} s (a deadlock?)")
    tail = (done.stdout + done.stderr)[-3000:]
    want = f"over {ranks} ranks, 8 tokens generated on rank {ranks - 1}: equal to one process"
    assert done.returncode == 0 and want in done.stdout, tail


def check_generate_split(lm, model, ranks, length=70):
    """``lm`` (compiled with ``ranks``) over its ranks as threads of this process: the last
    rank's logits are the whole prefill's, and its greedy tokens transformers'.  (Qwen3-Next's
    build in ``test_causal_lm_hybrids`` serves this too: one build, not two.)"""
    ids = torch.randint(3, 64, (1, length), generator=torch.Generator().manual_seed(3))
    last = in_threads(ranks, lambda rank: lm.prefill_part(ids[:, slice(*split(length, ranks)[rank])], rank))[-1]
    want = lm.prefill(ids.numpy())[0].numpy()
    assert np.abs(last[0].numpy() - want).max() <= 1e-4 * max(np.abs(want).max(), 1.0)
    got = in_threads(ranks, lambda rank: lm.generate_split(ids, rank, max_new_tokens=6))[-1]
    with torch.no_grad(), torch_kernels():
        expected = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=6)
    assert torch.equal(got, expected)


def test_a_token_shift_is_refused_at_compile_time():
    """RWKV reads the previous position (its token shift) outside any scan or conv: the split
    prefill would differ at each part's first token, so the probe at compile time refuses it."""
    torch.manual_seed(0)
    cfg = transformers.RwkvConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, attention_hidden_size=32,
                                  intermediate_size=64, context_length=64)
    lm = sw.compile_causal_lm(transformers.RwkvForCausalLM(cfg).eval(), ranks=2)
    with pytest.raises(SplitRefused, match="reads across"):
        lm.module()


def test_attention_caches_kept_as_tensors_are_refused_up_front():
    from test_causal_lm_hybrids import FAMILIES as HYBRIDS   # (it imports this module)

    model = HYBRIDS["qwen3_next"][0]()
    with pytest.raises(NotImplementedError, match="kept as tensors"):
        sw.compile_causal_lm(model, attention_cache="tensors", ranks=2)


def test_prefill_part_checks_its_arguments():
    """Bad arguments are named before anything is built.  (A Mamba-1 layer's split, selective
    scan and conv window, runs in a whole model in test_bf16_checkpoints' Jamba.)"""
    lm = sw.compile_causal_lm(tiny_mamba(), ranks=2)
    with pytest.raises(ValueError, match="rank: 2 is not in"):
        lm.prefill_part(np.zeros((1, 8), dtype=np.int64), 2)
    with pytest.raises(ValueError, match="needs at least 4"):
        lm.prefill_part(np.zeros((1, 3), dtype=np.int64), 0)
    with pytest.raises(ValueError, match="compile with ranks"):
        sw.compile_causal_lm(tiny_mamba()).prefill_part(np.zeros((1, 8), dtype=np.int64), 0)
    assert not lm._built            # pylint: disable=protected-access


def test_an_op_mixing_positions_is_refused_by_name():
    """A cumulative sum over the prompt left unfused: ``split_prefill`` names it."""
    from tvm import relax, tirx

    from relax_pass.split.sequence import split_prefill

    length = tirx.Var("L", "int64")
    x = relax.Var("x", relax.TensorType([1, length, 4], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("prefill", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.cumsum(x, axis=1))
        bb.emit_func_output(out)
    with pytest.raises(SplitRefused, match=r"= relax.cumsum\(...\): reads across the prompt's positions"):
        split_prefill(bb.get()["prefill"], 2, length)
