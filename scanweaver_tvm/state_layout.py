"""How a served model's states are laid out as a flat list of tensors, what ``prefill`` and
``decode`` (``causal_lm``) take and return.  ``StateLayout``: the states of a transformers
``Cache`` (linear-attention layers' conv windows and recurrent states, attention layers' keys
and values).  ``TensorTreeLayout``: a state container of the model's own (RWKV's ``state``
list), as its tensors in one walk order.  States a model keeps in its modules' attributes
(RecurrentGemma's conv windows and RG-LRU states) are slots of kind "module" (``held_states``).
"""
import contextlib
from dataclasses import dataclass


@dataclass(frozen=True)
class StateSlot:
    """One state tensor of the cache: layer ``layer``'s ``kind`` state number ``index``.
    Kinds: "conv" and "recurrent" (a linear-attention layer's windows and states, fixed
    shapes), "keys" and "values" (an attention layer's cache, (B, heads, T, head dim): T, the
    tokens seen, grows by one a decode step), "module" (a tensor the model keeps in attribute
    ``name``, "module path:attribute").  ``shape`` includes the batch on axis 0, where
    ``batched`` (a model's own container may hold counters for the whole batch: xLSTM's
    ``seqlen_offset``)."""
    layer: int
    kind: str
    index: int
    shape: tuple
    dtype: str
    name: str = ""
    batched: bool = True

    @property
    def grows(self):
        """Whether the tensor gains a position (axis 2) with every token."""
        return self.kind in ("keys", "values")


class StateLayout:
    """The cache's states in a fixed order, as a flat list of tensors (what the compiled
    functions take and return)."""

    def __init__(self, slots, paged=None):
        self.slots = tuple(slots)
        self.paged = paged            # a PagedSpec: attention layers in TVM's paged KV cache instead
        self.not_paged = None         # why attention caches stay tensors, where they do
        self.windowed = ()            # attention layers with a sliding window (carried only paged)

    def with_paged(self, spec):
        """This layout with the attention caches of ``spec.layers`` in a paged KV cache."""
        return StateLayout([s for s in self.slots if not s.grows], spec)

    @classmethod
    def of(cls, cache, held=None):
        """The layout of an initialized cache (after one prefill), then the states the model
        keeps in its modules (``held``: attribute name -> tensor).  Sliding-window attention
        caches are noted (``windowed``); layers of other kinds are refused."""
        from transformers.cache_utils import (DummyLayer, DynamicLayer, DynamicSlidingWindowLayer,
                                              LinearAttentionCacheLayerMixin)

        slots, windowed = [], []
        for i, layer in enumerate(cache.layers):
            if not isinstance(layer, (LinearAttentionCacheLayerMixin, DynamicLayer, DummyLayer)):
                raise NotImplementedError(
                    f"cache layer {i} is {type(layer).__name__}: not carried (linear-attention "
                    "states and attention's key/value caches are)")
            if isinstance(layer, DynamicSlidingWindowLayer):
                windowed.append(i)
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
        slots += [StateSlot(-1, "module", i, tuple(t.shape), _dtype(t), name)
                  for i, (name, t) in enumerate((held or {}).items())]
        if not slots:
            raise ValueError("the model's cache holds no state after a prefill: nothing to carry")
        layout = cls(slots)
        layout.windowed = tuple(windowed)
        return layout

    @property
    def grows(self):
        """Whether any state gains a position a token (an attention layer's cache)."""
        return any(s.grows for s in self.slots)

    def flatten(self, cache, model=None):
        """The state tensors after a step, in this layout's order: the cache's, then the
        model's attributes (``model`` is needed only where the layout has some)."""
        out = []
        for s in self.slots:
            if s.kind == "module":
                attrs, key = _attribute(model, s.name)
                out.append(attrs[key])
                continue
            layer = cache.layers[s.layer]
            if s.grows:
                out.append(layer.keys if s.kind == "keys" else layer.values)
            else:
                out.append((layer.conv_states if s.kind == "conv" else layer.recurrent_states)[s.index])
        return out

    def empty(self, model):
        """The cache a prefill starts from (paged attention layers keep nothing: their keys and
        values go to the paged cache as they come)."""
        from transformers import DynamicCache

        from .paged_attention import pass_through

        cache = DynamicCache(config=model.config)
        for i in (self.paged.layers if self.paged else ()):
            cache.layers[i].update = pass_through(i)
        return cache

    def restore(self, model, tensors):
        """A cache holding ``tensors`` (what ``flatten`` gave), as a decode step reads it; the
        model's state attributes set to theirs (run it inside ``attributes_restored``)."""
        cache = self.empty(model)
        self.load(cache, tensors)
        for s, t in zip(self.slots, tensors):
            if s.kind == "module":
                attrs, key = _attribute(model, s.name)
                attrs[key] = t
        return cache

    def load(self, cache, tensors):
        """Fill a fresh cache with ``tensors`` (copies: the model updates them in place), as
        if a prefill had written them."""
        for s, t in zip(self.slots, tensors):
            if s.kind == "module":
                continue
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


def _attribute(model, name):
    """``(the module's attribute dict, the key)`` of a "module path:attribute" name."""
    module, key = name.split(":")
    return vars(model.get_submodule(module)), key


def tensor_attributes(model):
    """The plain tensor attributes of the model's modules (not parameters or buffers), by
    "module path:attribute"."""
    import torch

    return {f"{path}:{key}": value for path, module in model.named_modules()
            for key, value in vars(module).items() if isinstance(value, torch.Tensor)}


def held_states(model, before):
    """The states a model keeps in its modules' attributes: the tensor attributes set during
    a run with a cache (new or replaced since ``before``, ``tensor_attributes`` taken
    before it)."""
    return {name: t for name, t in tensor_attributes(model).items() if before.get(name) is not t}


@contextlib.contextmanager
def attributes_restored(model):
    """Inside, the model may set tensor attributes on its modules (RecurrentGemma keeps its
    states there); after, every module's tensor (and None) attributes are as they were, and
    new tensor attributes are gone, so a later run (transformers' own ``generate``, a trace)
    starts from the model as it was."""
    import torch

    def kept(module):
        return {k: v for k, v in vars(module).items() if v is None or isinstance(v, torch.Tensor)}

    saved = [(module, kept(module)) for module in model.modules()]
    try:
        yield
    finally:
        for module, attrs in saved:
            for key in set(kept(module)) - set(attrs):
                del vars(module)[key]
            vars(module).update(attrs)


class TensorTreeLayout:
    """A model's own state container (RWKV's ``state`` list, xLSTM's ``xLSTMCache``), not a
    transformers ``Cache``: every tensor in it, in one walk order (lists, tuples, dicts,
    attributes), fixed shapes.  A decode step gets a copy of the container with its tensors
    replaced; a prefill starts from none (the model makes its own initial state)."""

    grows = False
    paged = None

    def __init__(self, template, slots):
        self.template, self.slots = template, tuple(slots)

    @classmethod
    def of(cls, cache, at_batch_2):
        """From the container after a prefill at batch 1 and the one at batch 2: a tensor whose
        axis 0 differs between them is per row."""
        leaves, wider = _leaves(cache), _leaves(at_batch_2)
        if not leaves:
            raise ValueError(f"the model's {type(cache).__name__} holds no tensor after a prefill: nothing to carry")
        if [t.dim() for t in leaves] != [t.dim() for t in wider]:
            raise ValueError(f"the model's {type(cache).__name__} holds other tensors at batch 2 than at batch 1")
        return cls(cache, [StateSlot(-1, "state", i, tuple(t.shape), _dtype(t),
                                     batched=t.dim() > 0 and t.shape[0] != w.shape[0])
                           for i, (t, w) in enumerate(zip(leaves, wider))])

    def flatten(self, cache, model=None):
        return _leaves(cache)

    def empty(self, model):
        return None

    def restore(self, model, tensors):
        return _rebuilt(self.template, iter([t.clone() for t in tensors]))   # (models update them in place)


def _leaves(x):
    """The tensors of a state container, in walk order."""
    import torch

    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _leaves(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _leaves(v)]
    if hasattr(x, "__dict__") and not isinstance(x, (torch.nn.Module, type)):
        return [t for k, v in vars(x).items() if k != "config" for t in _leaves(v)]
    return []


def _rebuilt(x, tensors):
    """``x`` with its tensors (``_leaves`` order) taken from ``tensors``."""
    import copy

    import torch

    if isinstance(x, torch.Tensor):
        return next(tensors)
    if isinstance(x, (list, tuple)):
        return type(x)(_rebuilt(v, tensors) for v in x)
    if isinstance(x, dict):
        return {k: _rebuilt(v, tensors) for k, v in x.items()}
    if _leaves(x):
        out = copy.copy(x)
        for k, v in vars(x).items():
            if k != "config" and _leaves(v):
                setattr(out, k, _rebuilt(v, tensors))
        return out
    return x
