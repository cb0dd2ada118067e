"""A causal LM's two steps traced and compiled (``causal_lm.py`` serves them): the state layout
of its cache (``_layout``: transformers' cache flattened, a model's own state container, or
attention in TVM's paged KV cache), prefill over a symbolic prompt length and decode of one
token traced through the model's own forward (``_steps``), and the two imported functions
compiled into one module per batch size (``_compile``), states updated in place."""
import contextlib
import inspect

from relax_pass.split.sequence import POSITIONED

from .state_layout import StateLayout, TensorTreeLayout, attributes_restored, held_states, tensor_attributes

PROBE = 40    # tokens of the prompt that checks a model's attention through the paged cache
              # (past a short sliding window)

_CACHE_FIELDS = ("cache", "past_key_values", "cache_params", "state")


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


def _cache_kwarg(model):
    """The name ``model.forward`` takes its state by (Mamba: ``cache``; RWKV: ``state``; most:
    ``past_key_values``)."""
    params = inspect.signature(model.forward).parameters
    return next((n for n in _CACHE_FIELDS if n in params), "past_key_values")


def _run(model, input_ids, cache, **extra):
    """``(last position's logits, the state after)``: the model's forward with its cache."""
    kwargs = {_cache_kwarg(model): cache, "use_cache": True, "logits_to_keep": 1, **extra}
    out = model(input_ids=input_ids, **kwargs)
    after = next((out[n] for n in _CACHE_FIELDS if n in out and out[n] is not None), cache)
    return out.logits[:, -1].float(), after


def _layout(model, attention_cache="paged"):
    """The state layout, from one eager prefill of two tokens: from a ``DynamicCache`` where
    the model takes a transformers cache (it fills the one it is given), else from none (RWKV's
    ``state=``); what it holds after is a transformers ``Cache`` or a container of its own,
    and the tensors the model set on its modules (``held_states``).  Attention caches go to a
    paged KV cache where ``_paged_spec`` finds they can; sliding-window ones only there."""
    import torch
    from transformers.cache_utils import Cache

    if attention_cache not in ("paged", "tensors"):
        raise ValueError(f"attention_cache: 'paged' or 'tensors', got {attention_cache!r}")
    before = tensor_attributes(model)
    with torch.no_grad(), torch_kernels(), attributes_restored(model):
        state = _first_state(model)
        held = held_states(model, before)
        own = state is not None and not isinstance(state, Cache)      # a container of its own
        at_batch_2 = _first_state(model, batch=2) if own else None
    if state is None:
        raise ValueError(f"{type(model).__name__} returns no cache or state with use_cache=True: nothing to carry")
    if own:
        return TensorTreeLayout.of(state, at_batch_2)
    layout = StateLayout.of(state, held)
    if attention_cache == "tensors" and layout.grows:
        layout.not_paged = "attention_cache='tensors' was asked for"
    spec = _paged_spec(model, layout) if layout.grows and attention_cache == "paged" else None
    if layout.windowed and not spec:
        raise NotImplementedError(
            f"cache layers {list(layout.windowed)} hold sliding-window attention, carried only in the paged KV "
            f"cache, which does not serve this model: {layout.not_paged}")
    return layout.with_paged(spec) if spec else layout


def _first_state(model, batch=1):
    """The state after an eager prefill of two tokens (``batch`` rows), from a fresh
    ``DynamicCache`` where the model takes a transformers cache, else (no such argument, or
    the model fails with one: xLSTM reads its own ``xLSTMCache``'s fields) from none: the
    model makes its own."""
    import torch
    from transformers import DynamicCache

    ids = torch.zeros((batch, 2), dtype=torch.long)
    if _cache_kwarg(model) in ("cache", "past_key_values"):
        try:
            return _run(model, ids, DynamicCache(config=model.config))[1]
        except (AttributeError, TypeError) as err:
            try:
                return _run(model, ids, None)[1]
            except Exception:                       # pylint: disable=broad-except (the first error is the one to show)
                raise err from None
    return _run(model, ids, None)[1]


@contextlib.contextmanager
def attention_implementation(model, name):
    """``model`` runs (and traces) its attention layers with transformers' implementation ``name``."""
    saved = model.config._attn_implementation
    model.config._attn_implementation = name
    try:
        yield
    finally:
        model.config._attn_implementation = saved


def _paged_spec(model, layout):
    """A ``PagedSpec`` when every attention layer can live in one paged KV cache: the model
    run with its attention through ``paged_attention`` (one eager prefill, the attention calls
    recorded) uses one shape for all, and computes the logits its own attention does.  Else
    None: the caches stay tensors."""
    import torch

    from . import paged_attention as paged

    layers = sorted({s.layer for s in layout.slots if s.grows})
    ids = (torch.arange(PROBE) * 7 % model.config.vocab_size)[None]
    try:
        with torch.no_grad(), torch_kernels(), attributes_restored(model):
            want, _ = _run(model, ids, layout.empty(model))
            probe = StateLayout(layout.slots, paged.PagedSpec(tuple(layers), 0, 0, 0, ""))
            with attention_implementation(model, paged.registered()), paged.recording() as calls:
                got, _ = _run(model, ids, probe.empty(model))
    except Exception as err:          # pylint: disable=broad-except (the tensor caches serve it)
        return _not_paged(layout, f"its attention through the paged cache fails: {type(err).__name__}: {err}")
    shapes = {(q.shape[1], k.shape[1], q.shape[3], k.shape[3], v.shape[3], str(q.dtype), window)
              for _, q, k, v, window in calls}
    if sorted({layer for layer, *_ in calls}) != layers:
        return _not_paged(layout, f"attention calls seen at layers {sorted({c[0] for c in calls})}, "
                                  f"caches at {layers}")
    if len(shapes) != 1 or len(set(next(iter(shapes))[2:4])) != 1:
        return _not_paged(layout, "one cache needs one (q heads, kv heads, q/k head size, v head size, dtype, "
                                  "sliding window): "
                                  f"{sorted(shapes)}")
    if not torch.allclose(got, want, rtol=1e-4, atol=1e-4):
        return _not_paged(layout, "its logits with the paged attention differ from its own: "
                                  f"{float((got - want).abs().max()):.3g}")
    (q_heads, kv_heads, dim, _, value_dim, dtype, window), = shapes
    return paged.PagedSpec(tuple(layers), q_heads, kv_heads, max(dim, value_dim), dtype.split(".")[-1], window)


def _not_paged(layout, why):
    layout.not_paged = why
    return None


def _steps(model, layout):
    """The two traced modules: ``prefill(input_ids)`` and ``decode(token_ids, *states)``, each
    returning ``(logits of the last position, *states)``.  (Each runs the model inside
    ``attributes_restored``: what it sets on its modules is read into the states, then undone.)"""
    import torch

    class Prefill(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids):
            with attributes_restored(self.model):
                logits, cache = _run(self.model, input_ids, layout.empty(self.model))
                return (logits, *layout.flatten(cache, self.model))

    class Decode(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, token_ids, *states):
            with attributes_restored(self.model):
                logits, cache = _run(self.model, token_ids, layout.restore(self.model, states))
                return (logits, *layout.flatten(cache, self.model))

    class PagedDecode(torch.nn.Module):
        """(The paged cache holds the positions seen; the model's rotary embedding reads them
        from ``position_ids``.)"""
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, token_ids, position_ids, *states):
            with attributes_restored(self.model):
                logits, cache = _run(self.model, token_ids, layout.restore(self.model, states),
                                     position_ids=position_ids)
                return (logits, *layout.flatten(cache, self.model))

    class PagedPrefill(torch.nn.Module):
        """(Positions come in, as the cache knows them: a prompt after tokens already seen, or
        a rank's part of one, starts past position 0.)"""
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, position_ids):
            with attributes_restored(self.model):
                logits, cache = _run(self.model, input_ids, layout.empty(self.model), position_ids=position_ids)
                return (logits, *layout.flatten(cache, self.model))

    if getattr(layout, "paged", None):
        return PagedPrefill().eval(), PagedDecode().eval()

    return Prefill().eval(), Decode().eval()


def _compile(model, layout, batch, target, prompt_sizes, shortest, weights=None, ranks=None):
    """``(IRModule, VirtualMachine, executable)`` of both steps at batch ``batch``
    (``import_steps``), compiled."""
    import tvm
    from tvm import relax

    from .api import compile as sw_compile

    mod = import_steps(model, layout, batch, target, tuple(prompt_sizes), shortest, ranks)
    executable = sw_compile(mod, target, weights=weights)
    return mod, relax.VirtualMachine(executable, tvm.cpu()), executable


def import_steps(model, layout, batch, target, prompt_sizes, shortest, ranks=None):
    """Import both steps at batch ``batch`` (prefill over a symbolic prompt length ``L`` of at
    least ``shortest``, traced at ``prompt_sizes``), merged into one IRModule.  ``ranks``: also
    ``prefill_split``, the prefill of one rank's part of the prompt among ``ranks``
    (``relax_pass.split.sequence``)."""
    import torch
    import tvm
    from tvm import relax

    from .api import from_torch

    from . import paged_attention as paged

    prefill, decode = _steps(model, layout)
    spec = getattr(layout, "paged", None)
    ids = torch.zeros((batch, max(prompt_sizes)), dtype=torch.long)
    length = torch.export.Dim("L", min=shortest)
    states = [torch.zeros(_empty(s, batch, 1), dtype=getattr(torch, s.dtype)) for s in layout.slots]
    token = torch.zeros((batch, 1), dtype=torch.long)
    with attention_implementation(model, paged.registered()) if spec else contextlib.nullcontext():
        if spec:
            pre = from_torch(prefill, (ids, torch.zeros_like(ids)), trace_sizes={"L": list(prompt_sizes)},
                             dynamic_shapes={"input_ids": {1: length}, "position_ids": {1: length}})
        else:
            pre = from_torch(prefill, (ids,), dynamic_shapes={"input_ids": {1: length}},
                             trace_sizes={"L": list(prompt_sizes)})
        if spec:
            dec = from_torch(decode, (token, torch.ones_like(token), *states))
        elif layout.grows:       # attention caches as tensors: T positions seen, symbolic
            dec = from_torch(decode, (token, *states),
                             dynamic_shapes=[None] + [{2: "T"} if s.grows else None for s in layout.slots])
        else:
            dec = from_torch(decode, (token, *states))
    mod = tvm.IRModule()
    for name, source in (("prefill", pre), ("decode", dec)):
        for gv, func in source.functions_items():
            new = name if gv.name_hint == "main" else f"{name}_{gv.name_hint}"
            if isinstance(func, relax.Function):
                if spec and gv.name_hint == "main":
                    if ranks and name == "prefill":     # (split with its attention calls unbound)
                        mod[POSITIONED] = func.with_attr("global_symbol", POSITIONED)
                    func = paged.bind_kv_cache(func, spec)
                if name == "decode" and gv.name_hint == "main":
                    func = _states_in_place(func, layout, first_state=2 if spec else 1)
                func = func.with_attr("global_symbol", new)
            mod[new] = func
    if spec:
        mod = paged.add_create_function(mod, spec, target)
    if ranks:
        mod = _with_split_prefill(mod, ranks)
    return mod


def _with_split_prefill(mod, ranks):
    from relax_pass.split.sequence import add_split_prefill

    from .sequence_parallel import collective  # noqa: F401 (registers the all-gather prefill_split calls)

    return add_split_prefill(mod, ranks)


def _states_in_place(decode, layout, first_state):
    """``decode`` asking ``InPlaceStates`` to write each fixed-shape state into the buffer it
    came in (output 1 + i is state i, parameter ``first_state`` + i)."""
    from relax_pass.in_place import IN_PLACE_ATTR

    pairs = [[1 + i, first_state + i] for i, s in enumerate(layout.slots) if not s.grows]
    return decode.with_attr(IN_PLACE_ATTR, pairs) if pairs else decode


def _empty(slot, batch, seen=0):
    """The shape of ``slot`` at batch ``batch`` after ``seen`` tokens (only caches grow)."""
    if not slot.batched:
        return slot.shape
    shape = (batch,) + slot.shape[1:]
    return shape[:2] + (seen,) + shape[3:] if slot.grows else shape
