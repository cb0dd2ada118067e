"""Serve what we compile: a causal LM as two entry points, ``prefill`` and ``decode``, with its
recurrent states carried from one to the next, and ``generate`` on top.

Derived from the model's own code, not a model definition per family: transformers' cache
(``DynamicCache``) keeps each linear-attention layer's conv window and recurrent state
(``LinearAttentionCacheLayerMixin``: Mamba, Mamba-2, Gated DeltaNet, ...).  Both steps are
traced through the model's own forward with that cache flattened into tensors
(``StateLayout``): prefill from an empty cache over a prompt of symbolic length, decode one
token from a cache loaded with the given states.  Each returns the last position's logits and
the states after it.  The two imported functions go into one IRModule (``prefill``,
``decode``), compiled once by ``sw.compile`` (the prompt's scans fused), one executable per
batch size.  Attention layers' key/value caches (the hybrids) are not carried yet: such a
model raises ``NotImplementedError`` naming the layer.
"""
import contextlib
import inspect
import time
from dataclasses import dataclass

import numpy as np


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


@dataclass(frozen=True)
class StateSlot:
    """One state tensor of the cache: layer ``layer``'s ``kind`` state number ``index``.
    Kinds: "conv" and "recurrent" (a linear-attention layer's windows and states, fixed
    shapes), "keys" and "values" (an attention layer's cache, (B, heads, T, head dim): T, the
    tokens seen, grows by one a decode step).  ``shape`` includes the batch."""
    layer: int
    kind: str
    index: int
    shape: tuple
    dtype: str

    @property
    def grows(self):
        """Whether the tensor gains a position (axis 2) with every token."""
        return self.kind in ("keys", "values")


class StateLayout:
    """The cache's states in a fixed order, as a flat list of tensors (what the compiled
    functions take and return)."""

    def __init__(self, slots):
        self.slots = tuple(slots)

    @classmethod
    def of(cls, cache):
        """The layout of an initialized cache (after one prefill).  Sliding-window attention
        (its window's position is a Python int of the cache) and other layers are refused."""
        from transformers.cache_utils import (DummyLayer, DynamicLayer, DynamicSlidingWindowLayer,
                                              LinearAttentionCacheLayerMixin)

        slots = []
        for i, layer in enumerate(cache.layers):
            if isinstance(layer, DynamicSlidingWindowLayer) or not isinstance(
                    layer, (LinearAttentionCacheLayerMixin, DynamicLayer, DummyLayer)):
                raise NotImplementedError(
                    f"cache layer {i} is {type(layer).__name__}: not carried (linear-attention "
                    "states and full attention's key/value caches are; sliding windows are not yet)")
            if isinstance(layer, LinearAttentionCacheLayerMixin):
                for kind, states, ready in (("conv", layer.conv_states, layer.is_conv_states_initialized),
                                            ("recurrent", layer.recurrent_states,
                                             layer.is_recurrent_states_initialized)):
                    for idx, tensor in states.items():
                        if ready[idx] and tensor is not None:
                            slots.append(StateSlot(i, kind, idx, tuple(tensor.shape), _dtype(tensor)))
            if isinstance(layer, DynamicLayer) and layer.is_initialized and layer.keys is not None:
                slots += [StateSlot(i, kind, 0, tuple(t.shape), _dtype(t))
                          for kind, t in (("keys", layer.keys), ("values", layer.values))]
        if not slots:
            raise ValueError("the model's cache holds no state after a prefill: nothing to carry")
        return cls(slots)

    @property
    def grows(self):
        """Whether any state gains a position a token (an attention layer's cache)."""
        return any(s.grows for s in self.slots)

    def flatten(self, cache):
        """The cache's state tensors, in this layout's order."""
        out = []
        for s in self.slots:
            layer = cache.layers[s.layer]
            if s.grows:
                out.append(layer.keys if s.kind == "keys" else layer.values)
            else:
                out.append((layer.conv_states if s.kind == "conv" else layer.recurrent_states)[s.index])
        return out

    def load(self, cache, tensors):
        """Fill a fresh cache with ``tensors`` (copies: the model updates them in place), as
        if a prefill had written them."""
        for s, t in zip(self.slots, tensors):
            layer = cache.layers[s.layer]
            if s.grows:
                layer.device, layer.is_initialized = t.device, True
                if s.kind == "keys":
                    layer.keys = t
                else:
                    layer.values = t
                continue
            layer.dtype, layer.device = t.dtype, t.device
            if s.kind == "conv":
                layer.conv_states[s.index] = t.clone()
                layer.conv_kernel_size[s.index] = s.shape[-1]
                layer.is_conv_states_initialized[s.index] = True
            else:
                layer.recurrent_states[s.index] = t.clone()
                layer.is_recurrent_states_initialized[s.index] = True
            layer.has_previous_state[s.index] = True


def _dtype(tensor):
    return str(tensor.dtype).split(".")[-1]


@contextlib.contextmanager
def torch_kernels():
    """transformers' package kernels (fla's Triton, mamba_ssm's and causal_conv1d's CUDA) set
    aside for their torch reference path, the path ``torch.export`` traces.  Inside, a model
    runs eagerly on a CPU where fla is installed (Qwen3-Next, Kimi Linear: fla's Triton
    kernels otherwise fail there) and computes what the trace computes."""
    from transformers.integrations import hub_kernels

    saved = hub_kernels.is_torchdynamo_exporting
    hub_kernels.is_torchdynamo_exporting = lambda: True
    try:
        yield
    finally:
        hub_kernels.is_torchdynamo_exporting = saved


def _new_cache(model):
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def _cache_kwarg(model):
    """The name ``model.forward`` takes its cache by (Mamba: ``cache``; most: ``past_key_values``)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _run(model, input_ids, cache):
    kwargs = {_cache_kwarg(model): cache, "use_cache": True, "logits_to_keep": 1}
    return model(input_ids=input_ids, **kwargs).logits[:, -1].float()


def _steps(model, layout):
    """The two traced modules: ``prefill(input_ids)`` and ``decode(token_ids, *states)``, each
    returning ``(logits of the last position, *states)``."""
    import torch

    class Prefill(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids):
            cache = _new_cache(self.model)
            logits = _run(self.model, input_ids, cache)
            return (logits, *layout.flatten(cache))

    class Decode(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, token_ids, *states):
            cache = _new_cache(self.model)
            layout.load(cache, states)
            logits = _run(self.model, token_ids, cache)
            return (logits, *layout.flatten(cache))

    return Prefill().eval(), Decode().eval()


def _load(model_or_path):
    if isinstance(model_or_path, (str, bytes)) or hasattr(model_or_path, "__fspath__"):
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(model_or_path).eval()
    return model_or_path.eval()


class CompiledCausalLM:
    """``prefill``/``decode`` compiled with ScanWeaver for ``target``, and ``generate``."""

    def __init__(self, model, target="llvm", prompt_sizes=None):
        import torch

        self.model, self.target, self.prompt_sizes = model, target, prompt_sizes
        self.config = model.config
        with torch.no_grad(), torch_kernels():
            cache = _new_cache(model)
            _run(model, torch.zeros((1, 2), dtype=torch.long), cache)
        self.layout = StateLayout.of(cache)
        self._built = {}                  # batch size -> (IRModule, VirtualMachine)
        self.last_timings = None          # Timings of the last generate

    def module(self, batch=1):
        """The IRModule of ``prefill`` and ``decode`` at batch ``batch`` (imported, not lowered)."""
        return self._build(batch)[0]

    def _build(self, batch):
        if batch not in self._built:
            first = self.shortest_prompt
            sizes = self.prompt_sizes or (first + 1, first + 3, first + 5)
            self._built[batch] = _compile(self.model, self.layout, batch, self.target, sizes, first)
        return self._built[batch]

    @property
    def shortest_prompt(self):
        """The shortest prompt ``prefill`` runs as one call: its trace holds for prompts at
        least as long as the widest conv window (a shorter one is padded inside the model, a
        different program); shorter prompts are decoded token by token from zero states,
        which is what the model computes for them."""
        return max([s.shape[-1] for s in self.layout.slots if s.kind == "conv"] + [1])

    def zero_states(self, batch=1):
        """The states before any token (what a fresh cache holds)."""
        import tvm

        return [tvm.runtime.tensor(np.zeros(_empty(s, batch), dtype=s.dtype)) for s in self.layout.slots]

    def prefill(self, input_ids):
        """``(logits (B, vocab) of the last position, states)`` after the prompt ``input_ids``."""
        import tvm

        ids = _as_ids(input_ids)
        if ids.shape[1] < self.shortest_prompt:
            states = self.zero_states(ids.shape[0])
            for t in range(ids.shape[1]):
                logits, states = self.decode(ids[:, t], states)
            return logits, states
        vm = self._build(ids.shape[0])[1]
        out = vm["prefill"](tvm.runtime.tensor(ids))
        return out[0], list(out[1:])

    def decode(self, token_ids, states):
        """One step: ``(logits (B, vocab), states)`` after ``token_ids`` (B,) or (B, 1)."""
        import tvm

        ids = _as_ids(token_ids).reshape(-1, 1)
        vm = self._build(ids.shape[0])[1]
        out = vm["decode"](tvm.runtime.tensor(ids), *states)
        return out[0], list(out[1:])

    def generate(self, input_ids, max_new_tokens=20, do_sample=False, temperature=1.0, top_k=None,
                 top_p=None, eos_token_id=None, pad_token_id=None, generator=None):
        """transformers' ``generate`` arguments and return value: ``(B, L + new)`` token ids
        (a torch tensor).  Greedy unless ``do_sample``; sampling draws with ``torch.multinomial``
        (seeded by ``torch.manual_seed`` or ``generator``).  A sequence that emitted
        ``eos_token_id`` continues with ``pad_token_id`` (else eos) until all have; both
        default to the model's ``generation_config``, as in transformers."""
        import torch

        ids = torch.as_tensor(_as_ids(input_ids))
        defaults = getattr(self.model, "generation_config", None)
        if eos_token_id is None:
            eos_token_id = getattr(defaults, "eos_token_id", None)
        if pad_token_id is None:
            pad_token_id = getattr(defaults, "pad_token_id", None)
        eos = set(np.atleast_1d(eos_token_id).tolist()) if eos_token_id is not None else set()
        pad = pad_token_id if pad_token_id is not None else (min(eos) if eos else 0)
        done = torch.zeros(ids.shape[0], dtype=torch.bool)
        self._build(ids.shape[0])                      # compiled before the clock starts
        start = time.perf_counter()
        logits, states = self.prefill(ids.numpy())
        timings = Timings(ids.shape[1], time.perf_counter() - start)
        self.last_timings = timings
        start = time.perf_counter()
        out = [ids]
        for step in range(max_new_tokens):
            scores = torch.from_numpy(logits.numpy())
            nxt = _pick(scores, do_sample, temperature, top_k, top_p, generator)
            nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
            out.append(nxt[:, None])
            done |= torch.tensor([int(t) in eos for t in nxt.tolist()])
            if bool(done.all()) or step == max_new_tokens - 1:
                break
            logits, states = self.decode(nxt.numpy(), states)
            timings.decode_steps += 1
            timings.decode_s = time.perf_counter() - start
        return torch.cat(out, dim=1)


def _pick(scores, do_sample, temperature, top_k, top_p, generator):
    """The next token of each row: argmax, or a draw after temperature, top-k and top-p
    (transformers' warpers, in its order)."""
    import torch

    if not do_sample:
        return scores.argmax(-1)
    scores = scores / max(float(temperature), 1e-6)
    if top_k:
        kth = torch.topk(scores, min(int(top_k), scores.shape[-1]), dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False, dim=-1)
        cum = sorted_scores.softmax(-1).cumsum(-1)
        drop = cum <= (1 - top_p)
        drop[..., -1:] = False                          # keep at least the best token
        scores = scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return torch.multinomial(scores.softmax(-1), 1, generator=generator)[:, 0]


def _as_ids(x):
    arr = x.numpy() if hasattr(x, "numpy") else np.asarray(x)
    arr = np.ascontiguousarray(arr, dtype=np.int64)
    if arr.ndim == 1:
        arr = arr[None]
    if arr.ndim != 2:
        raise ValueError(f"token ids: expected (B, L) or (L,), got shape {arr.shape}")
    return arr


def _compile(model, layout, batch, target, prompt_sizes, shortest):
    """Import both steps at batch ``batch`` (prefill over a symbolic prompt length ``L`` of at
    least ``shortest``, traced at ``prompt_sizes``), merge them into one IRModule, compile it."""
    import torch
    import tvm
    from tvm import relax

    from .api import compile as sw_compile
    from .api import from_torch

    prefill, decode = _steps(model, layout)
    ids = torch.zeros((batch, max(prompt_sizes)), dtype=torch.long)
    length = torch.export.Dim("L", min=shortest)
    pre = from_torch(prefill, (ids,), dynamic_shapes={"input_ids": {1: length}},
                     trace_sizes={"L": list(prompt_sizes)})
    states = [torch.zeros(_empty(s, batch, 1), dtype=getattr(torch, s.dtype)) for s in layout.slots]
    token = torch.zeros((batch, 1), dtype=torch.long)
    if layout.grows:       # attention caches: T positions seen, symbolic
        dec = from_torch(decode, (token, *states),
                         dynamic_shapes=[None] + [{2: "T"} if s.grows else None for s in layout.slots])
    else:
        dec = from_torch(decode, (token, *states))
    mod = tvm.IRModule()
    for name, source in (("prefill", pre), ("decode", dec)):
        for gv, func in source.functions_items():
            new = name if gv.name_hint == "main" else f"{name}_{gv.name_hint}"
            if isinstance(func, relax.Function):
                func = func.with_attr("global_symbol", new)
            mod[new] = func
    vm = relax.VirtualMachine(sw_compile(mod, target), tvm.cpu())
    return mod, vm


def _empty(slot, batch, seen=0):
    """The shape of ``slot`` at batch ``batch`` after ``seen`` tokens (only caches grow)."""
    shape = (batch,) + slot.shape[1:]
    return shape[:2] + (seen,) + shape[3:] if slot.grows else shape


def compile_causal_lm(model_or_path, target="llvm", prompt_sizes=None):
    """A transformers causal LM (an object, or a checkpoint directory for
    ``from_pretrained``) as ``CompiledCausalLM``: ``prefill``, ``decode`` and ``generate``,
    compiled on first use for each batch size.  ``prompt_sizes``: the prompt lengths traced to
    generalize ``L`` (``from_torch``'s ``trace_sizes``)."""
    return CompiledCausalLM(_load(model_or_path), target, prompt_sizes)
