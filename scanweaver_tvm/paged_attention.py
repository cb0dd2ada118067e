"""Attention layers of a served model through TVM's paged KV cache (``TIRPagedKVCache``).

The model's own code is traced, with its attention routed through one op of ours: transformers
calls every attention layer's kernel through ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]``
(after RoPE, with the keys and values the cache returns), so an implementation registered there
(``ATTN_IMPLEMENTATION``) sees each layer's new queries, keys and values.  It calls the torch
op ``scanweaver::paged_attention(q, k, v, layer, scale, window)``; the cache layers of those attention
layers (``PassThroughLayer``) keep nothing and return the new keys and values as they are, and
the causal mask is left to the kernel (the registered mask function builds none).  In Relax the
op is a placeholder call (``PLACEHOLDER``) with the shapes of q, k and v, so a trace generalizes
over L like any other op; ``bind_kv_cache`` then gives the function a ``kv_cache`` parameter and
turns each placeholder into ``vm.builtin.attention_kv_cache_attention_with_fused_qkv`` on it
(q, k, v fused as (B*L, Hq + 2 Hkv, D)), and ``add_create_function`` adds the function that
makes the cache (TVM's CPU attention kernels with it).  Rotary embeddings are the model's (the
cache is made with ``RopeMode.NONE``); positions come in as ``position_ids``.

The kernels need one (key/value heads, head dim, sliding window) for every layer; a smaller
v head size is padded.  A model whose attention layers differ, or use a soft cap or sinks,
keeps its caches as tensors (``causal_lm``).  A sliding window (RecurrentGemma's local
attention) is served by ScanWeaver's CPU kernels only: the cache keeps every key, the kernels
mask by position.
"""
import contextlib
import json
from dataclasses import dataclass

import numpy as np

from relax_pass.split.attention import PLACEHOLDER
from tir_schedules.paged_attention_cpu import replace_cache_kernels

__all__ = ["ATTN_IMPLEMENTATION", "PLACEHOLDER", "PagedSpec", "registered", "bind_kv_cache",
           "add_create_function", "KVCache"]

ATTN_IMPLEMENTATION = "scanweaver_paged"
PAGE_SIZE = 16


@dataclass(frozen=True)
class PagedSpec:
    """The shapes the paged cache is made for: attention layers ``layers`` (the model's layer
    indices, in the cache's order), ``q_heads``/``kv_heads`` heads of ``head_dim`` (the larger
    of the q/k and v head sizes: the smaller is padded with zeros); ``window``: each query
    sees its last ``window`` keys (0: all before it)."""
    layers: tuple
    q_heads: int
    kv_heads: int
    head_dim: int
    dtype: str
    window: int = 0

    def cache_layer(self, model_layer):
        return self.layers.index(model_layer)


_OP = None


def _op():
    """``torch.ops.scanweaver.paged_attention``, defined once.  Eagerly it is causal attention
    over the keys and values it is given (a prefill from an empty cache), each query on its
    last ``window`` keys when ``window`` > 0; traced, its shape."""
    global _OP
    if _OP is None:
        import torch

        @torch.library.custom_op("scanweaver::paged_attention", mutates_args=())
        def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
                            scale: float, window: int) -> torch.Tensor:
            rep = q.shape[1] // k.shape[1]
            at = torch.arange(q.shape[2])
            back = at[:, None] - at[None, :]             # how far back each key is
            visible = (back >= 0) & ((back < window) if window > 0 else True)
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), attn_mask=visible, scale=scale)
            return out.transpose(1, 2).contiguous()

        @paged_attention.register_fake
        def _(q, k, v, layer, scale, window):
            return q.new_empty((q.shape[0], q.shape[2], q.shape[1], v.shape[3]))

        _OP = torch.ops.scanweaver.paged_attention
    return _OP


_RECORDS = []


@contextlib.contextmanager
def recording():
    """The attention calls made inside, as (layer, q, k, v, window)."""
    calls = []
    _RECORDS.append(calls)
    try:
        yield calls
    finally:
        _RECORDS.remove(calls)


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function signature: (B, H, L, D) in, ((B, L, Hq, D), None) out."""
    for name in ("softcap", "s_aux"):
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"attention layer {getattr(module, 'layer_idx', '?')}: {name} is "
                                      "not served by the paged KV cache")
    layer = _UPDATED[-1] if _UPDATED else getattr(module, "layer_idx", None)
    if layer is None:
        raise NotImplementedError(f"{type(module).__name__}: no cache layer known for its attention")
    _UPDATED.clear()
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    window = int(kwargs.get("sliding_window") or 0)
    for calls in _RECORDS:
        calls.append((int(layer), query, key, value, window))
    return _op()(query, key, value, int(layer), scale, window), None


_UPDATED = []


def pass_through(layer):
    """The ``update`` of cache layer ``layer`` of a paged attention layer: it keeps nothing and
    returns the new keys and values; it notes the layer for the attention call that follows
    (Zamba's shared attention block has no ``layer_idx`` of its own)."""
    def update(keys, values, *args, **kwargs):
        _UPDATED[:] = [layer]
        return keys, values
    return update


def _no_mask(*args, **kwargs):
    return None


def registered():
    """Register the attention and mask implementations with transformers (idempotent);
    returns ``ATTN_IMPLEMENTATION``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, _attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, _no_mask)
    return ATTN_IMPLEMENTATION


def convert_paged_attention(node, importer):
    """The Relax converter of ``scanweaver::paged_attention``: the placeholder call on q, k and
    v as (B, L, heads, D) (the window goes with it, checked against the cache's)."""
    from tvm import relax

    emit = importer.block_builder.emit
    q, k, v = (emit(relax.op.permute_dims(importer.env[a], [0, 2, 1, 3])) for a in node.args[:3])
    layer, scale, window = int(node.args[3]), float(node.args[4]), int(node.args[5])
    b, length, heads, _ = q.ty.shape
    out = relax.TensorType((b, length, heads, v.ty.shape[3]), q.ty.dtype)
    return emit(relax.call_dps_packed(relax.ExternFunc(PLACEHOLDER),
                                      [relax.prim_value(layer), relax.prim_value(scale), relax.prim_value(window),
                                       q, k, v], out_ty=out))


def bind_kv_cache(func, spec):
    """``func`` with a last parameter ``kv_cache`` and each placeholder call an attention on it."""
    from tvm import relax

    cache = relax.Var("kv_cache", relax.ObjectType())

    @relax.expr_functor.mutator
    class Bind(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not (len(call.args) == 2 and isinstance(call.args[0], relax.ExternFunc)
                    and call.args[0].global_symbol == PLACEHOLDER):
                return call
            layer, scale, window, q, k, v = call.args[1].fields
            if int(window.value) != spec.window:
                raise ValueError(f"attention layer {int(layer.value)}: sliding window {int(window.value)}, "
                                 f"the cache's kernels are made for {spec.window}")
            b, length, heads, _ = q.ty.shape
            dim, value_dim = spec.head_dim, v.ty.shape[3]
            emit = self.builder_.emit
            q, k, v = (_zero_padded(emit, x, dim) for x in (q, k, v))
            qkv = emit(relax.op.concat([q, k, v], axis=2))
            qkv = emit(relax.op.reshape(qkv, (b * length, heads + 2 * spec.kv_heads, dim)))
            out = emit(relax.call_dps_packed(
                "vm.builtin.attention_kv_cache_attention_with_fused_qkv",
                [cache, relax.prim_value(spec.cache_layer(int(layer.value))), scale, qkv],
                out_ty=relax.TensorType((b * length, heads, dim), q.ty.dtype)))
            out = emit(relax.op.reshape(out, (b, length, heads, dim)))
            if int(value_dim) == dim:
                return out
            return relax.op.strided_slice(out, axes=[3], begin=[0], end=[value_dim])

    new = Bind().visit_expr(func)
    return relax.Function(list(new.params) + [cache], new.body, new.ret_ty, new.is_pure, new.attrs)


def _zero_padded(emit, x, dim):
    """``x`` (B, L, heads, d) with zeros to head size ``dim``: attention on q/k padded with
    zeros has the same scores, on v padded the same output in its first columns; one cache
    then holds layers whose q/k and v head sizes differ (MLA's)."""
    from tvm import relax

    short = dim - int(x.ty.shape[3])
    return x if short == 0 else emit(relax.op.nn.pad(x, [0, 0, 0, 0, 0, 0, 0, short]))


def add_create_function(mod, spec, target):
    """``mod`` with ``create_kv_cache(sizes)``: ``sizes`` is (max batch, max total length,
    prefill chunk, page size, sliding window 0/1); the cache's TIR kernels come with it, the
    CPU prefill and decode attention ones ScanWeaver's (``tir_schedules.paged_attention_cpu``)."""
    import tvm
    from tvm import relax, tirx
    from tvm.relax.frontend.nn.llm.kv_cache import RopeMode, TIRPagedKVCache

    target = tvm.target.Target(target) if isinstance(target, str) else target
    if spec.window and target.kind.name != "llvm":
        raise NotImplementedError(f"sliding-window attention (window {spec.window}) in the paged KV cache: "
                                  f"only ScanWeaver's CPU kernels mask by window, not TVM's {target.kind.name} ones")
    names = ("max_batch_size", "max_total_seq_len", "prefill_chunk_size", "page_size", "support_sliding_window")
    syms = [tirx.Var(n, "int64") for n in names]
    sizes = relax.Var("sizes", relax.ShapeType(syms))
    bb = relax.BlockBuilder(mod)
    with bb.function("create_kv_cache", [sizes]):
        cache = TIRPagedKVCache(
            attn_kind="mha", max_batch_size=syms[0], max_total_seq_len=syms[1], prefill_chunk_size=syms[2],
            page_size=syms[3], support_sliding_window=syms[4], layer_partition=relax.ShapeExpr([0, len(spec.layers)]),
            num_hidden_layers=len(spec.layers), num_attention_heads=spec.q_heads, num_key_value_heads=spec.kv_heads,
            qk_head_dim=spec.head_dim, v_head_dim=spec.head_dim, mla_original_qk_head_dim=0,
            mla_original_v_head_dim=0, rope_mode=RopeMode.NONE, rope_scale=1, rope_theta=10000, rope_scaling={},
            rope_ext_factors=relax.prim_value(0), rotary_dim=spec.head_dim, enable_disaggregation=False,
            dtype=spec.dtype, target=target)
        bb.emit_func_output(bb.emit(cache._expr))    # pylint: disable=protected-access
    # on a CPU, parallel attention kernels in place of TVM's one-core ones (no-op elsewhere)
    return replace_cache_kernels(bb.get(), spec.kv_heads, spec.q_heads, spec.head_dim, spec.dtype, PAGE_SIZE,
                                 spec.window)


class KVCache:
    """One paged KV cache object of a VM, holding ``batch`` sequences (ids 0..batch-1), with
    room for ``max_length`` tokens each; ``begin(n)``/``end(n)`` bracket a call that appends
    ``n`` tokens to every sequence, or to the sequences ``seqs`` only (the cache's begin/end
    forward: a padded batch's rows are prefilled one at a time, each to its own length)."""

    def __init__(self, vm, batch, max_length, chunk):
        import tvm
        import tvm_ffi

        get = tvm.get_global_func
        self.batch, self.max_length = batch, max_length
        pages = -(-max_length // PAGE_SIZE) * PAGE_SIZE
        self.handle = vm["create_kv_cache"](tvm_ffi.Shape([batch, batch * pages, max(chunk, 1), PAGE_SIZE, 0]))
        for seq in range(batch):
            get("vm.builtin.kv_state_add_sequence")(self.handle, seq)
        self._begin, self._end = get("vm.builtin.kv_state_begin_forward"), get("vm.builtin.kv_state_end_forward")
        self.lengths = np.zeros(batch, dtype=np.int64)     # tokens seen, per sequence

    def _seqs(self, seqs):
        return list(range(self.batch)) if seqs is None else [int(s) for s in seqs]

    def begin(self, tokens, seqs=None):
        import tvm_ffi

        seqs = self._seqs(seqs)
        longest = int(self.lengths[seqs].max())
        if longest + tokens > self.max_length:
            raise ValueError(f"the KV cache holds {self.max_length} tokens a sequence: {longest} seen, "
                             f"{tokens} more do not fit (pass a larger max_length)")
        self._begin(self.handle, tvm_ffi.Shape(seqs), tvm_ffi.Shape([tokens] * len(seqs)))

    def end(self, tokens, seqs=None):
        self._end(self.handle)
        self.lengths[self._seqs(seqs)] += tokens

    def load_prompt(self, keys, values):
        """Fill the cache's empty sequences with a prompt's keys and values, as a prefill of it
        would: ``keys``/``values`` are lists, one (B, n, kv heads, d) array a cache layer (d up
        to the head size: padded with zeros as ``bind_kv_cache`` pads).  Through TVM's
        checkpoint import (one page group a layer, pages of ``PAGE_SIZE`` positions)."""
        import tvm

        get = tvm.get_global_func
        metadata = get("vm.builtin.attention_kv_cache_get_checkpoint_metadata")
        length = int(keys[0].shape[1])
        pages = -(-length // PAGE_SIZE)
        for seq in range(self.batch):
            if self.lengths[seq]:
                raise ValueError(f"load_prompt: sequence {seq} already holds {self.lengths[seq]} tokens")
            meta = json.loads(metadata(self.handle, seq))
            meta["seq_length"] = length
            meta["logical_pages"] = [{"logical_page_index": i, "start_pos": i * PAGE_SIZE,
                                      "length": min(PAGE_SIZE, length - i * PAGE_SIZE)} for i in range(pages)]
            groups = []
            for group in meta["groups"]:
                layers = range(group["layer_begin"], group["layer_end"])
                block = np.stack([_pages(keys[i][seq], values[i][seq], pages, group["shape"][-1]) for i in layers])
                group.update(num_logical_pages=pages, shape=list(block.shape), nbytes=block.nbytes)
                groups.append((group["group_index"], np.ascontiguousarray(block)))
            get("vm.builtin.attention_kv_cache_prepare_import")(self.handle, seq, json.dumps(meta))
            for index, block in groups:
                get("vm.builtin.attention_kv_cache_import_page_group")(self.handle, seq, index, tvm.runtime.tensor(block))
            get("vm.builtin.attention_kv_cache_finish_import")(self.handle, seq)
            self.lengths[seq] = length

    def sequence_lengths(self):
        """The tokens the cache holds for each sequence (TVM's count)."""
        import tvm

        length = tvm.get_global_func("vm.builtin.attention_kv_cache_get_sequence_length")
        return [int(length(self.handle, seq)) for seq in range(self.batch)]

    def positions(self, tokens, seqs=None):
        """The positions of the next ``tokens`` tokens of ``seqs`` (default all), (len(seqs), tokens) int64."""
        return self.lengths[self._seqs(seqs), None] + np.arange(tokens, dtype=np.int64)


def _pages(keys, values, pages, dim):
    """One layer's page group: (pages, 2, kv heads, PAGE_SIZE, dim) from (n, kv heads, d) keys
    and values (positions past n and columns past d zero)."""
    n, heads = keys.shape[:2]
    out = np.zeros((pages * PAGE_SIZE, 2, heads, dim), dtype=keys.dtype)
    out[:n, 0, :, :keys.shape[2]] = keys
    out[:n, 1, :, :values.shape[2]] = values
    return out.reshape(pages, PAGE_SIZE, 2, heads, dim).transpose(0, 2, 3, 1, 4)
