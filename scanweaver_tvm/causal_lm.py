"""Serve what we compile: a causal LM as two entry points, ``prefill`` and ``decode``, with its
states carried from one to the next, and ``generate`` on top.

Derived from the model's own code, not a model definition per family: transformers' cache
(``DynamicCache``) keeps each linear-attention layer's conv window and recurrent state
(``LinearAttentionCacheLayerMixin``: Mamba, Mamba-2, Gated DeltaNet, ...) and each attention
layer's keys and values (the hybrids: Jamba, Bamba, Zamba, Qwen3-Next, ...).  Both steps are
traced through the model's own forward with that cache flattened into tensors
(``StateLayout``): prefill from an empty cache over a prompt of symbolic length ``L``, decode
one token from a cache loaded with the given states (attention caches over a symbolic ``T``
positions seen, returned with ``T + 1``).  A model with a state container of its own (RWKV's
``state`` list, xLSTM's ``xLSTMCache``) is carried as its tensors (``TensorTreeLayout``).  Each step returns the last
position's logits and the states after it.  The two imported functions go into one IRModule
(``prefill``, ``decode``), compiled once by ``sw.compile`` (the prompt's scans fused), one
executable per batch size.  States a model keeps in its modules' attributes (RecurrentGemma)
are slots too; sliding-window attention is carried in the paged KV cache only.

Tracing and compiling the two steps is ``causal_lm_steps.py``; this module serves them.
"""
import contextlib
import functools
import threading
import time
from dataclasses import dataclass

import numpy as np

from relax_pass.quantize_weights import weight_format

from . import causal_lm_split
from .causal_lm_steps import _compile, _empty, _layout, torch_kernels
from .state_layout import TensorTreeLayout, attributes_restored


@dataclass
class Timings:
    """Wall times of one ``generate``: the prompt's prefill and the decode steps after it."""
    prompt_tokens: int
    prefill_s: float
    decode_steps: int = 0
    decode_s: float = 0.0

    @property
    def prefill_tokens_per_s(self):
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else float("inf")

    @property
    def decode_tokens_per_s(self):
        return self.decode_steps / self.decode_s if self.decode_s > 0 else float("nan")


ROOM = 4096   # tokens a paged KV cache has room for after the prompt, unless told


def _load(model_or_path):
    if isinstance(model_or_path, (str, bytes)) or hasattr(model_or_path, "__fspath__"):
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(model_or_path).eval()
    return model_or_path.eval()


_IMPORTING = threading.Lock()   # torch.export is not thread-safe: ranks' threads import in turn


class CompiledCausalLM:
    """``prefill``/``decode`` compiled with ScanWeaver for ``target``, and ``generate``."""

    def __init__(self, model, target="llvm", prompt_sizes=None, attention_cache="paged", weights=None, ranks=None,
                 tensor_parallel=None):
        if ranks is not None and (not isinstance(ranks, int) or ranks < 1):
            raise ValueError(f"ranks: needs a positive int, got {ranks!r}")
        if tensor_parallel is not None:
            if ranks:
                raise NotImplementedError("ranks and tensor_parallel together: one or the other")
            from . import tensor_parallel as tp
            from .sequence_parallel import collective  # noqa: F401 (registers the all-reduce the shard calls)

            model = tp.shard(model, *tensor_parallel)
        self.tensor_parallel = tensor_parallel
        self.model, self.target, self.prompt_sizes, self.weights = model, target, prompt_sizes, weights
        self.ranks = ranks
        if weights is not None:
            weight_format(weights)        # (an unknown format: a clear error now, not at the build)
        self.config = model.config
        self.layout = _layout(model, attention_cache)
        if ranks and self.layout.grows and not getattr(self.layout, "paged", None):
            raise NotImplementedError(f"ranks: {type(model).__name__}'s attention caches are kept as tensors "
                                      f"({self.layout.not_paged}); a split prefill exchanges keys and values "
                                      "into the paged KV cache only")
        self._built = {}                  # batch size -> (IRModule, VirtualMachine, executable)
        self._threads = threading.local() # a VM of each thread but the first (a VM is not thread-safe)
        self._building = threading.Lock()
        self.last_timings = None          # Timings of the last generate

    def module(self, batch=1):
        """The IRModule of ``prefill`` and ``decode`` at batch ``batch`` (imported, not lowered)."""
        return self._build(batch)[0]

    def _build(self, batch):
        if batch in self._built:          # (the split's check reads it from its threads, lock held)
            return self._built[batch]
        with self._building:              # (ranks run as threads build once)
            if batch not in self._built:
                self._compile_batch(batch)
        return self._built[batch]

    def _compile_batch(self, batch):
        """Compile batch ``batch``; with ranks, validate its split prefill (``causal_lm_split.check``)."""
        first = self.shortest_prompt
        sizes = self.prompt_sizes or (first + 1, first + 3, first + 5)
        with _IMPORTING:
            self._built[batch] = _compile(self.model, self.layout, batch, self.target, sizes, first, self.weights,
                                          self.ranks)
        if self.ranks:
            try:
                causal_lm_split.check(self, batch)
            except Exception:
                del self._built[batch]
                raise

    def _vm(self, batch):
        """The VM of batch ``batch`` for this thread (ranks run as threads each have one)."""
        if threading.current_thread() is threading.main_thread():
            return self._build(batch)[1]
        own = self._threads.__dict__.setdefault("vms", {})
        if batch not in own:
            from tvm import relax, runtime

            own[batch] = relax.VirtualMachine(self._build(batch)[2], runtime.cpu())
        return own[batch]

    @property
    def shortest_prompt(self):
        """The shortest prompt ``prefill`` runs as one call: its trace holds for prompts at
        least as long as the widest conv window (a shorter one is padded inside the model, a
        different program); shorter prompts are decoded token by token from zero states,
        which is what the model computes for them.  A state a model keeps in its modules is
        taken for a window along its last axis when it has three axes or more
        (RecurrentGemma's conv windows, (B, width, kernel - 1))."""
        return max([s.shape[-1] for s in self.layout.slots
                    if s.kind == "conv" or (s.kind == "module" and len(s.shape) >= 3)] + [1])

    def zero_states(self, batch=1, max_length=None):
        """The states before any token (what a fresh transformers cache holds); with attention
        layers in a paged KV cache, a fresh one first, with room for ``max_length`` tokens a
        sequence (default ``ROOM``).  A model with a state container of its own makes its
        initial state inside its forward (RWKV's is not zeros): there, start with ``prefill``."""
        cache = [self._kv_cache(batch, max_length or ROOM, batch)] if self.layout.paged else []
        return cache + self._zero_tensors(batch)

    def _zero_tensors(self, batch):
        import tvm

        if isinstance(self.layout, TensorTreeLayout):
            raise NotImplementedError(f"{type(self.model).__name__} makes its own initial state: start with prefill")
        return [tvm.runtime.tensor(np.zeros(_empty(s, batch), dtype=s.dtype)) for s in self.layout.slots]

    def _kv_cache(self, batch, max_length, chunk):
        from .paged_attention import KVCache

        return KVCache(self._vm(batch), batch, max_length, chunk)

    def prefill(self, input_ids, max_length=None, attention_mask=None):
        """``(logits (B, vocab) of the last position, states)`` after the prompt ``input_ids``.
        With attention layers in a paged KV cache, ``states[0]`` is that cache, made here with
        room for ``max_length`` tokens a sequence (default: the prompt and ``ROOM`` more).
        ``attention_mask`` (B, L), as a tokenizer returns it: a left-padded row (zeros, then
        ones) is its unpadded prompt, as transformers computes it for models that mask their
        padding (``_prefill_padded``)."""
        ids = _as_ids(input_ids)
        batch, length = ids.shape
        max_length = max_length or length + ROOM
        starts = _padding(attention_mask, ids.shape)
        if starts.any():
            return self._prefill_padded(ids, starts, max_length)
        cache = self._kv_cache(batch, max_length, batch * length) if self.layout.paged else None
        return self._prefill(ids, cache)

    def _prefill(self, ids, cache, seqs=None):
        """``prefill`` of ``ids``, the sequences ``seqs`` (default all) of ``cache`` when paged."""
        import tvm

        batch, length = ids.shape
        if length < self.shortest_prompt:
            states = ([cache] if cache else []) + self._zero_tensors(batch)
            for t in range(length):
                logits, states = self._decode(ids[:, t:t + 1], states, seqs)
            return logits, states
        vm = self._vm(batch)
        if cache is None:
            out = vm["prefill"](tvm.runtime.tensor(ids))
            return out[0], list(out[1:])
        positions = tvm.runtime.tensor(cache.positions(length, seqs))
        cache.begin(length, seqs)
        out = vm["prefill"](tvm.runtime.tensor(ids), positions, cache.handle)
        cache.end(length, seqs)
        return out[0], [cache] + list(out[1:])

    def prefill_part(self, input_ids, rank, max_length=None):
        """This rank's part of a prompt split across ``ranks`` ranks (consecutive parts, each
        at least ``shortest_prompt`` tokens, as ``scanweaver_core.sequence_parts.split`` cuts):
        ``(logits (B, vocab) of the part's last position, states)``.  Every rank calls it at
        once (one all-gather a layer, on torch.distributed's default group); the last rank's
        logits and states are the whole prompt's, so decode runs there.  With attention
        layers, ``states[0]`` is there a paged KV cache holding the whole prompt, with room
        for ``max_length`` tokens a sequence (default: the prompt and ``ROOM`` more); on the
        other ranks None."""
        if not self.ranks:
            raise ValueError("prefill_part: compile with ranks=N (compile_causal_lm(..., ranks=N))")
        if not isinstance(rank, int) or not 0 <= rank < self.ranks:
            raise ValueError(f"rank: {rank!r} is not in [0, {self.ranks})")
        ids = _as_ids(input_ids)
        if ids.shape[1] < self.shortest_prompt:
            raise ValueError(f"input_ids: a part of {ids.shape[1]} tokens; each rank's part needs at least "
                             f"{self.shortest_prompt} (the conv window)")
        return causal_lm_split.run_part(self, self._vm(ids.shape[0]), ids, rank, max_length)

    def generate_split(self, input_ids, rank, max_new_tokens=20):
        """Greedy ``generate`` of a prompt prefilled across the ranks (every rank passes the
        whole ``input_ids``; each prefills its part, ``prefill_part``): the last rank decodes
        and returns ``(B, L + new)`` ids (a torch tensor), the others None."""
        import torch

        from scanweaver_core.sequence_parts import split

        ids = _as_ids(input_ids)
        start, stop = split(ids.shape[1], self.ranks)[rank]
        logits, states = self.prefill_part(ids[:, start:stop], rank, max_length=ids.shape[1] + max_new_tokens)
        if rank != self.ranks - 1:
            return None
        out = [ids]
        for step in range(max_new_tokens):
            nxt = logits.numpy().argmax(-1)
            out.append(nxt[:, None])
            if step < max_new_tokens - 1:
                logits, states = self.decode(nxt, states)
        return torch.from_numpy(np.concatenate(out, axis=1))

    def _prefill_padded(self, ids, starts, max_length):
        """Each row's prompt without its padding, prefilled alone (batch 1; into its own
        sequence of one paged cache), the rows' states stacked: what transformers' generate
        computes for a left-padded batch when the model masks its padding, which is checked
        once per model (``padding_refused``)."""
        import tvm

        self._check_padding_served()
        batch = ids.shape[0]
        cache = self._kv_cache(batch, max_length, ids.shape[1]) if self.layout.paged else None
        rows = [self._prefill(ids[i:i + 1, start:], cache, [i]) for i, start in enumerate(starts)]
        first = 1 if cache else 0
        stacked = [tvm.runtime.tensor(np.concatenate([states[k].numpy() for _, states in rows]))
                   for k in range(first, len(rows[0][1]))]
        logits = tvm.runtime.tensor(np.concatenate([logits.numpy() for logits, _ in rows]))
        return logits, ([cache] if cache else []) + stacked

    def padding_refused(self):
        """None when padded prompts are served (``prefill``'s ``attention_mask``), else why not:
        the model must give a left-padded row what it gives the row alone (transformers' own
        generate, compared once on a probe: RWKV and RecurrentGemma ignore the mask there), and
        the rows' states must stack (attention caches as tensors have one length for all)."""
        if self.layout.grows and not self.layout.paged:
            return "attention caches kept as tensors hold one length for every row"
        if not all(s.batched for s in self.layout.slots):
            return "the model's state holds values for the whole batch (not one per row)"
        return self._transformers_padding_mismatch or None

    @functools.cached_property
    def _transformers_padding_mismatch(self):
        return _padding_mismatch(self.model)          # (a probe through transformers: once)

    def _check_padding_served(self):
        why = self.padding_refused()
        if why:
            raise NotImplementedError(f"attention_mask: padded prompts: {why}; generate rows of different "
                                      "lengths one call each")

    def decode(self, token_ids, states):
        """One step: ``(logits (B, vocab), states)`` after ``token_ids`` (B,) or (B, 1).  The
        states are updated in place: the step's kernels write the new recurrent states into the
        tensors passed in (``relax_pass.in_place``; returned again), and a paged KV cache gains
        the step's keys and values.  Copy them first to keep the old ones.  (Attention caches
        kept as tensors, which grow, are returned new.)"""
        return self._decode(_as_ids(token_ids).reshape(-1, 1), states)

    def _decode(self, ids, states, seqs=None):
        import tvm

        vm = self._vm(ids.shape[0])
        if not self.layout.paged:
            out = vm["decode"](tvm.runtime.tensor(ids), *states)
            return out[0], list(out[1:])
        cache, tensors = states[0], states[1:]
        positions = tvm.runtime.tensor(cache.positions(1, seqs))
        cache.begin(1, seqs)
        out = vm["decode"](tvm.runtime.tensor(ids), positions, *tensors, cache.handle)
        cache.end(1, seqs)
        return out[0], [cache] + list(out[1:])

    def generate(self, input_ids, max_new_tokens=20, do_sample=False, temperature=1.0, top_k=None,
                 top_p=None, eos_token_id=None, pad_token_id=None, generator=None, attention_mask=None):
        """transformers' ``generate`` arguments and return value: ``(B, L + new)`` token ids
        (a torch tensor).  Greedy unless ``do_sample``; sampling draws with ``torch.multinomial``
        (seeded by ``torch.manual_seed`` or ``generator``).  A sequence that emitted
        ``eos_token_id`` continues with ``pad_token_id`` (else eos) until all have; both
        default to the model's ``generation_config``, as in transformers.  ``attention_mask``:
        what a tokenizer returns next to the ids (``lm.generate(**tokenizer(texts,
        padding=True, padding_side="left"))``); padded rows as ``prefill`` takes them."""
        import torch

        ids = torch.as_tensor(_as_ids(input_ids))
        starts = _padding(attention_mask, tuple(ids.shape))
        defaults = getattr(self.model, "generation_config", None)
        if eos_token_id is None:
            eos_token_id = getattr(defaults, "eos_token_id", None)
        if pad_token_id is None:
            pad_token_id = getattr(defaults, "pad_token_id", None)
        eos = set(np.atleast_1d(eos_token_id).tolist()) if eos_token_id is not None else set()
        pad = pad_token_id if pad_token_id is not None else (min(eos) if eos else 0)
        done = np.zeros(ids.shape[0], dtype=bool)
        if starts.any():
            self._check_padding_served()
            self._build(1)                             # (padded rows are prefilled one at a time)
        self._build(ids.shape[0])                      # compiled before the clock starts
        with _one_torch_thread():
            start = time.perf_counter()
            logits, states = self.prefill(ids.numpy(), max_length=ids.shape[1] + max_new_tokens,
                                          attention_mask=attention_mask)
            timings = Timings(ids.shape[1], time.perf_counter() - start)
            self.last_timings = timings
            start = time.perf_counter()
            out = [ids.numpy()]
            for step in range(max_new_tokens):
                nxt = _pick(logits.numpy(), do_sample, temperature, top_k, top_p, generator)
                nxt = np.where(done, pad, nxt)
                out.append(nxt[:, None])
                done |= np.isin(nxt, list(eos))
                if done.all() or step == max_new_tokens - 1:
                    break
                logits, states = self.decode(nxt, states)
                timings.decode_steps += 1
                timings.decode_s = time.perf_counter() - start
        return torch.from_numpy(np.concatenate(out, axis=1))


def _padding(attention_mask, shape):
    """The first unpadded position of each row (zeros when ``attention_mask`` is None or all
    ones); only left padding (zeros, then ones: ``padding_side="left"``, what transformers'
    generate expects of a decoder) is taken."""
    starts = np.zeros(shape[0], dtype=np.int64)
    if attention_mask is None:
        return starts
    mask = np.asarray(attention_mask.numpy() if hasattr(attention_mask, "numpy") else attention_mask)
    if mask.shape != tuple(shape):
        raise ValueError(f"attention_mask: shape {mask.shape}, expected the token ids' {tuple(shape)}")
    if not np.isin(mask, (0, 1)).all():
        raise ValueError("attention_mask: expected zeros (padding) and ones")
    for i, row in enumerate(mask):
        starts[i] = shape[1] - int(row.sum())
        if starts[i] == shape[1] or not (row[starts[i]:] == 1).all():
            raise ValueError(f"attention_mask: row {i} is not left-padded (zeros, then at least one 1): "
                             f"{row.tolist()}; tokenize with padding_side='left'")
    return starts


def _padding_mismatch(model):
    """Why a left-padded row does not generate what the row alone does in transformers (``""``
    when it does): both through the model's own ``generate``, greedy, on a probe (4 padding
    positions, 8 tokens), compared by logits."""
    import torch

    pad, n, new = 4, 8, 3
    ids = (torch.arange(pad + n) * 7 + 3) % model.config.vocab_size
    alone = ids[None, pad:]
    padded = torch.stack([torch.cat([torch.zeros(pad, dtype=torch.long), ids[pad:]]), ids])
    mask = torch.ones_like(padded)
    mask[0, :pad] = 0
    kwargs = dict(do_sample=False, max_new_tokens=new, output_logits=True, return_dict_in_generate=True,
                  pad_token_id=0)
    with torch.no_grad(), torch_kernels(), attributes_restored(model):
        want = model.generate(alone, attention_mask=torch.ones_like(alone), **kwargs).logits
        got = model.generate(padded, attention_mask=mask, **kwargs).logits
    scale = max(float(w.abs().max()) for w in want)
    diff = max(float((g[0] - w[0]).abs().max()) for g, w in zip(got, want))
    if diff > 1e-3 * max(scale, 1.0):
        return (f"transformers' {type(model).__name__} gives a left-padded row other logits than the row alone "
                f"(by {diff:.3g}; it does not mask its padding)")
    return ""


@contextlib.contextmanager
def _one_torch_thread():
    """torch on one thread while generating: a sampling step's torch ops on many threads leave
    OpenMP workers spinning for a while after each, on the cores the next decode's TVM
    threads need.  A precaution: bench.generate measured no difference on this machine."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def _pick(logits, do_sample, temperature, top_k, top_p, generator):
    """The next token of each row of ``logits`` (B, vocab), as int64: argmax (numpy), or a
    draw after temperature, top-k and top-p (transformers' warpers, in its order; torch)."""
    import torch

    if not do_sample:
        return logits.argmax(-1).astype(np.int64)
    scores = torch.from_numpy(logits).float() / max(float(temperature), 1e-6)
    if top_k:
        kth = torch.topk(scores, min(int(top_k), scores.shape[-1]), dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False, dim=-1)
        cum = sorted_scores.softmax(-1).cumsum(-1)
        drop = cum <= (1 - top_p)
        drop[..., -1:] = False                          # keep at least the best token
        scores = scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return torch.multinomial(scores.softmax(-1), 1, generator=generator)[:, 0].numpy()


def _as_ids(x):
    arr = x.numpy() if hasattr(x, "numpy") else np.asarray(x)
    arr = np.ascontiguousarray(arr, dtype=np.int64)
    if arr.ndim == 1:
        arr = arr[None]
    if arr.ndim != 2:
        raise ValueError(f"token ids: expected (B, L) or (L,), got shape {arr.shape}")
    return arr


def compile_causal_lm(model_or_path, target="llvm", prompt_sizes=None, attention_cache="paged", weights=None,
                      ranks=None, tensor_parallel=None):
    """A transformers causal LM (an object, or a checkpoint directory for
    ``from_pretrained``) as ``CompiledCausalLM``: ``prefill``, ``decode`` and ``generate``,
    compiled on first use for each batch size.  ``prompt_sizes``: the prompt lengths traced to
    generalize ``L`` (``from_torch``'s ``trace_sizes``).  ``attention_cache``: "paged" (TVM's
    paged KV cache where its kernels fit the model's attention layers, else tensors; the
    reason is ``layout.not_paged``) or "tensors" (each decode returns the caches one position
    longer: a copy per token).  ``weights``: a weight format (``"int8"``, ``"int4"``,
    ...) quantizes the dense layers' weights (``sw.compile``'s ``weights``); None keeps the model's.
    ``ranks``: also compile the prefill of one rank's part of a prompt split across ``ranks``
    torch.distributed ranks (``prefill_part``, ``generate_split``; recurrent models and hybrids
    whose attention is in the paged cache).  ``tensor_parallel``: ``(rank, world)``, compile
    this rank's shard of the model (its mixers' channels split, an all-reduce after each
    row-parallel projection: ``tensor_parallel``); every rank then runs the same calls."""
    return CompiledCausalLM(_load(model_or_path), target, prompt_sizes, attention_cache, weights, ranks,
                            tensor_parallel)
