"""Prefill one long prompt across the ranks of a torch.distributed job and generate from it::

    torchrun --nproc-per-node 2 -m scanweaver_tvm.sequence_parallel.generate [CHECKPOINT] --length 2048

Every rank loads the checkpoint (default: the demo's Mamba; a hybrid's attention in the paged
cache too), compiles it with ``ranks`` = the job's size, and prefills its consecutive part of
the prompt (``generate_split``: one all-gather a layer for the scan summaries, one for the conv
windows, one for an attention layer's keys and values).  The last rank decodes
and checks the tokens against the same model generating in one process (its ``prefill`` of the
whole prompt, from the same build); the command exits non-zero when they differ.  The prompt
is the checkpoint's tokenizer on a passage of ``bench/data``'s text, or random ids.

``--tensor-parallel``: each rank compiles its shard of the model instead (``tensor_parallel``:
the mixers' channels split, an all-reduce after each row-parallel projection) and every rank
generates; the last checks its tokens against transformers'."""
import argparse
import os
import sys

import numpy as np
import torch
import torch.distributed as dist

from scanweaver_core.targets import physical_cores

DEMO = os.path.join(os.path.dirname(os.path.dirname(__file__)), "demo_model")
TEXT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "bench", "data",
                    "tinyshakespeare.txt.gz")


def prompt_ids(checkpoint, length, seed=0):
    """``(1, length)`` ids: the checkpoint's tokenizer on the text (from a seeded offset), or
    random ids when there is no tokenizer or text."""
    try:
        import gzip

        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        with gzip.open(TEXT, "rt") as f:
            text = f.read()
        start = np.random.default_rng(seed).integers(0, len(text) // 2)
        ids = tokenizer(text[start:start + 16 * length])["input_ids"][:length]
        if len(ids) == length:
            return np.array([ids], dtype=np.int64)
    except (OSError, ValueError, ImportError):
        pass
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(checkpoint).vocab_size
    return np.random.default_rng(seed).integers(0, vocab, (1, length))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("checkpoint", nargs="?", default=DEMO)
    parser.add_argument("--length", type=int, default=2048, help="prompt tokens")
    parser.add_argument("--new", type=int, default=16, help="tokens to generate")
    parser.add_argument("--tensor-parallel", action="store_true",
                        help="shard the model's mixers over the ranks instead (every rank generates; checked "
                             "against transformers)")
    args = parser.parse_args(argv)
    os.environ["TVM_NUM_THREADS"] = str(max(1, physical_cores() // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    from .. import compile_causal_lm  # pylint: disable=import-outside-toplevel

    ids = prompt_ids(args.checkpoint, args.length)
    if args.tensor_parallel:
        lm = compile_causal_lm(args.checkpoint, tensor_parallel=(rank, world))
        got = lm.generate(ids, max_new_tokens=args.new, do_sample=False, eos_token_id=-1)
        how = "sharded over"
    else:
        lm = compile_causal_lm(args.checkpoint, ranks=world)
        got = lm.generate_split(ids, rank, args.new)
        how = "prefilled over"
    failed = 0
    if got is not None and (rank == world - 1 or not args.tensor_parallel):
        want = _transformers(args.checkpoint, ids, args.new) if args.tensor_parallel else \
            lm.generate(ids, max_new_tokens=args.new, do_sample=False, eos_token_id=-1)
        equal = torch.equal(got, want)
        print(f"{os.path.basename(os.path.normpath(args.checkpoint))}: a {args.length}-token prompt {how} "
              f"{world} ranks, {args.new} tokens generated on rank {rank}: "
              + ("equal to one process" if equal else f"differ from one process:\n{got[0, -args.new:].tolist()}\n"
                 f"{want[0, -args.new:].tolist()}"), flush=True)
        failed = int(not equal)
    flag = torch.tensor([failed])
    dist.broadcast(flag, world - 1)
    dist.destroy_process_group()
    return int(flag.item())


def _transformers(checkpoint, ids, new):
    """The checkpoint's greedy tokens in transformers (its torch path)."""
    from transformers import AutoModelForCausalLM

    from ..causal_lm import torch_kernels  # pylint: disable=import-outside-toplevel

    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    ids = torch.as_tensor(ids)
    with torch.no_grad(), torch_kernels():
        return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new,
                              eos_token_id=None, min_new_tokens=new)


if __name__ == "__main__":
    sys.exit(main())
