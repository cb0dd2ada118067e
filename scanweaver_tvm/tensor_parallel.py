"""Tensor-parallel layers: one rank's shard of a model, its mixers' channels split across the
ranks, compiled like any model (``compile_causal_lm(model, tensor_parallel=(rank, world))``).

As MLC-LLM shards by heads on Disco: the projections into a mixer are split by output
(column-parallel), the scan runs on the rank's channels only (a Mamba channel is a head of one
lane: its conv, its state, its decay are its own), and each projection that sums over the
channels (row-parallel) is followed by one all-reduce.  A Mamba mixer has two: ``x_proj`` (dt,
B and C read every channel) and ``out_proj``; a Mamba-2 mixer (split by head) ``out_proj``,
and its gated norm's sum of squares when one group spans every head; attention (split by
key/value head) ``o_proj``; an MLP its down projection.  Embeddings, norms, the lm head and
layers without a rule (mixtures of experts among them) are replicated (computed whole on every
rank).  The shard is a copy of the model whose layers hold their part of the weights (so each
rank first holds the whole model: a checkpoint loaded by shard would not); the all-reduce is
the torch op ``scanweaver::all_reduce``, traced, and in Relax the extern
``scanweaver.ccl.allreduce(send, recv)`` (laid out as ``R.ccl.allreduce``), which
``sequence_parallel.collective`` carries over torch.distributed (or between threads).

Every rank runs the same steps in lockstep (prefill, each decode step), and every rank ends with
the full logits.  Families are sharded by rule (``RULES``); another is refused, naming its mixer."""
import copy
import functools

ALLREDUCE = "scanweaver.ccl.allreduce"

_OP = None


def all_reduce_op():
    """``torch.ops.scanweaver.all_reduce``, defined once: the sum over the ranks.  Eagerly it is
    the collective's (``collective.all_reduce``: torch.distributed or the ranks' threads;
    alone, the identity); traced, an op the frontend turns into ``ALLREDUCE``."""
    global _OP
    if _OP is None:
        import torch

        @torch.library.custom_op("scanweaver::all_reduce", mutates_args=())
        def all_reduce(x: torch.Tensor) -> torch.Tensor:
            from .sequence_parallel.collective import all_reduce as reduce  # pylint: disable=import-outside-toplevel

            return reduce(x.contiguous())

        @all_reduce.register_fake
        def _(x):
            return torch.empty_like(x)

        _OP = torch.ops.scanweaver.all_reduce
    return _OP


def convert_all_reduce(node, importer):
    """The Relax converter of ``scanweaver::all_reduce``: the extern on its one tensor."""
    from tvm import relax

    x = importer.env[node.args[0]]
    return importer.block_builder.emit(relax.call_dps_packed(ALLREDUCE, [x], out_ty=x.ty))


def shard(model, rank, world):
    """A copy of ``model`` holding rank ``rank``'s part of each mixer (of ``world``)."""
    if not isinstance(world, int) or world < 1 or not isinstance(rank, int) or not 0 <= rank < world:
        raise ValueError(f"tensor_parallel: (rank, world) with 0 <= rank < world, got ({rank!r}, {world!r})")
    out = copy.deepcopy(model)
    mixers = [m for m in out.modules() if type(m).__name__ in RULES]
    if not mixers:
        names = sorted({type(m).__name__ for m in out.modules() if "Mixer" in type(m).__name__ or
                        "Attention" in type(m).__name__})
        raise NotImplementedError(f"tensor_parallel: {type(model).__name__} has no mixer we shard "
                                  f"({', '.join(names) or 'none found'}; sharded: {', '.join(RULES)})")
    for mixer in mixers:
        RULES[type(mixer).__name__](mixer, rank, world)
    return out


def _mamba(mixer, rank, world):
    """Mamba-1: the inner channels split; ``x_proj`` and ``out_proj`` reduced."""
    import torch

    width = mixer.intermediate_size
    if width % world:
        raise ValueError(f"tensor_parallel: {width} inner channels do not split over {world} ranks")
    keep = _block(width, world, rank, world)
    with torch.no_grad():
        mixer.in_proj = _rows(mixer.in_proj, torch.cat([keep, width + keep]))   # [x (width), gate (width)]
        mixer.x_proj = _columns(mixer.x_proj, keep, rank)
        mixer.dt_proj = _rows(mixer.dt_proj, keep)
        mixer.out_proj = _columns(mixer.out_proj, keep, rank)
        mixer.conv1d = _conv_channels(mixer.conv1d, keep)
        _keep_entries(mixer, ("A_log", "D"), keep)
    mixer.intermediate_size = width // world
    _reduce_output(mixer, "x_proj")
    _reduce_output(mixer, "out_proj")


def _mamba2(mixer, rank, world):
    """Mamba-2: the heads split (with their channels, dt, A, D); the groups of B and C split
    with them when they divide over the ranks, else (one group) every rank keeps B and C whole.
    With one group the gated norm spans every head: its sum of squares is all-reduced.
    ``out_proj`` reduced."""
    import torch

    heads, groups, state = mixer.num_heads, mixer.n_groups, mixer.ssm_state_size
    width, dim = mixer.intermediate_size, mixer.head_dim
    if heads % world or (groups > 1 and groups % world):
        raise ValueError(f"tensor_parallel: {heads} heads in {groups} groups do not split over {world} ranks")
    split_groups = groups % world == 0 and groups > 1
    part_heads = heads // world
    own_groups = groups // world if split_groups else groups
    channels = torch.arange(rank * part_heads * dim, (rank + 1) * part_heads * dim)
    group_rows = torch.arange(rank * own_groups * state, (rank + 1) * own_groups * state) \
        if split_groups else torch.arange(groups * state)
    head_rows = torch.arange(rank * part_heads, (rank + 1) * part_heads)
    # in_proj rows: [gate (width), x (width), B (groups N), C (groups N), dt (heads)]
    bc = width * 2
    rows = torch.cat([channels, width + channels, bc + group_rows, bc + groups * state + group_rows,
                      bc + 2 * groups * state + head_rows])
    conv_rows = torch.cat([channels, width + group_rows, width + groups * state + group_rows])
    with torch.no_grad():
        mixer.in_proj = _rows(mixer.in_proj, rows)
        mixer.conv1d = _conv_channels(mixer.conv1d, conv_rows)
        _keep_entries(mixer, ("A_log", "D", "dt_bias"), head_rows)
        mixer.out_proj = _columns(mixer.out_proj, channels, rank)
        norm = mixer.norm
        _keep_entries(norm, ("weight",), channels)
    mixer.intermediate_size, mixer.num_heads, mixer.n_groups = part_heads * dim, part_heads, own_groups
    mixer.conv_dim = part_heads * dim + 2 * own_groups * state
    if not split_groups:
        mixer.norm = _modules()[1](norm, world)
    _reduce_output(mixer, "out_proj")


def _gated_deltanet(mixer, rank, world):
    """Gated DeltaNet (Qwen3-Next, Qwen3.5): the key heads split, each rank with the value heads
    that read them (their state, decay, gate and norm are their own); ``out_proj`` reduced.
    Qwen3-Next projects [q | k | v | z] and [b | a] grouped by key head (a contiguous block a
    key head); Qwen3.5 projects q, k, v (together), z, b and a apart."""
    import torch

    k_heads, v_heads, k_dim, v_dim = mixer.num_k_heads, mixer.num_v_heads, mixer.head_k_dim, mixer.head_v_dim
    if k_heads % world:
        raise ValueError(f"tensor_parallel: {k_heads} key heads do not split over {world} ranks")
    keys, values = _block(k_heads * k_dim, k_heads, rank, world), _block(v_heads * v_dim, k_heads, rank, world)
    heads = _block(v_heads, k_heads, rank, world)
    key_width = k_heads * k_dim
    conv_rows = torch.cat([keys, key_width + keys, 2 * key_width + values])
    with _no_grad():
        if hasattr(mixer, "in_proj_qkvz"):
            for name in ("in_proj_qkvz", "in_proj_ba"):     # (a key head's rows: one block)
                dense = getattr(mixer, name)
                setattr(mixer, name, _rows(dense, _block(dense.out_features, k_heads, rank, world)))
        else:
            mixer.in_proj_qkv = _rows(mixer.in_proj_qkv, conv_rows)
            mixer.in_proj_z = _rows(mixer.in_proj_z, values)
            mixer.in_proj_b, mixer.in_proj_a = _rows(mixer.in_proj_b, heads), _rows(mixer.in_proj_a, heads)
        mixer.conv1d = _conv_channels(mixer.conv1d, conv_rows)
        _keep_entries(mixer, ("A_log", "dt_bias"), heads)
        mixer.out_proj = _columns(mixer.out_proj, values, rank)
    mixer.num_k_heads, mixer.num_v_heads = k_heads // world, v_heads // world
    mixer.key_dim, mixer.value_dim = mixer.key_dim // world, mixer.value_dim // world
    mixer.conv_dim = 2 * mixer.key_dim + mixer.value_dim
    _reduce_output(mixer, "out_proj")


def _attention(attn, rank, world):
    """Attention: the key/value heads split, each rank with the query heads that read them
    (grouped queries stay grouped); ``o_proj`` reduced.  A rank's paged KV cache then holds its
    own heads (the cache's shapes are read from the traced calls)."""
    cfg = attn.config
    q_heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    if kv_heads % world:
        raise ValueError(f"tensor_parallel: {kv_heads} key/value heads do not split over {world} ranks")
    with _no_grad():
        attn.q_proj = _rows(attn.q_proj, _block(attn.q_proj.out_features, q_heads, rank, world))
        attn.k_proj = _rows(attn.k_proj, _block(attn.k_proj.out_features, kv_heads, rank, world))
        attn.v_proj = _rows(attn.v_proj, _block(attn.v_proj.out_features, kv_heads, rank, world))
        attn.o_proj = _columns(attn.o_proj, _block(attn.o_proj.in_features, q_heads, rank, world), rank)
    _reduce_output(attn, "o_proj")


def _mlp(mlp, rank, world):
    """An MLP of ``down_proj(act(up_proj(x)))``, gated by ``gate_proj`` where it has one: its
    inner width split, ``down_proj`` reduced."""
    width = mlp.up_proj.out_features
    keep = _inner_share(width, rank, world)
    with _no_grad():
        for name in ("gate_proj", "up_proj"):
            if hasattr(mlp, name):
                setattr(mlp, name, _rows(getattr(mlp, name), keep))
        mlp.down_proj = _columns(mlp.down_proj, keep, rank)
    mlp.intermediate_size = width // world
    _reduce_output(mlp, "down_proj")


def _fused_mlp(mlp, rank, world):
    """Granite's shared MLP: ``input_linear`` gives [gate | up] (chunked in two), ``output_linear``
    reduces; the inner width split in both halves."""
    import torch

    width = mlp.output_linear.in_features
    keep = _inner_share(width, rank, world)
    with _no_grad():
        mlp.input_linear = _rows(mlp.input_linear, torch.cat([keep, width + keep]))
        mlp.output_linear = _columns(mlp.output_linear, keep, rank)
    mlp.hidden_size = width // world
    _reduce_output(mlp, "output_linear")


def _inner_share(width, rank, world):
    if width % world:
        raise ValueError(f"tensor_parallel: an MLP's {width} inner channels do not split over {world} ranks")
    return _block(width, world, rank, world)


def _block(size, parts, rank, world):
    """The indices of rank ``rank``'s share of ``size`` rows made of ``parts`` equal blocks (heads)."""
    import torch

    step = size // parts * (parts // world)
    return torch.arange(rank * step, (rank + 1) * step)


def _rows(dense, keep):
    """A column-parallel part of ``dense``: its outputs ``keep``."""
    return _linear(dense.weight[keep], None if dense.bias is None else dense.bias[keep])


def _columns(dense, keep, rank):
    """A row-parallel part of ``dense``: its inputs ``keep`` (its bias added on rank 0 only)."""
    return _linear(dense.weight[:, keep], _first_rank_bias(dense.bias, rank))


def _keep_entries(module, names, keep):
    """``module``'s per-channel (or per-head) parameters ``names`` cut to entries ``keep``."""
    from torch import nn

    for name in names:
        setattr(module, name, nn.Parameter(getattr(module, name)[keep].clone()))


def _no_grad():
    import torch

    return torch.no_grad()


def _linear(weight, bias):
    """A dense layer holding ``weight`` (out, in) and ``bias``."""
    from torch import nn

    return _filled(nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, dtype=weight.dtype,
                             device=weight.device), weight, bias)


def _conv_channels(conv, keep):
    """The depthwise causal conv of ``conv``'s channels ``keep``."""
    from torch import nn

    weight, bias = conv.weight[keep], None if conv.bias is None else conv.bias[keep]
    channels = weight.shape[0]
    return _filled(nn.Conv1d(channels, channels, weight.shape[2], groups=channels, padding=conv.padding[0],
                             bias=bias is not None, dtype=weight.dtype, device=weight.device), weight, bias)


def _filled(module, weight, bias):
    import torch

    with torch.no_grad():
        module.weight.copy_(weight)
        if bias is not None:
            module.bias.copy_(bias)
    return module


def _first_rank_bias(bias, rank):
    """A row-parallel projection's bias, added once: on rank 0."""
    import torch

    return None if bias is None else (bias if rank == 0 else torch.zeros_like(bias))


@functools.cache
def _modules():
    """``(Reduced, ReducedGatedNorm)``, made on first use (torch is imported lazily)."""
    import torch
    from torch import nn

    class Reduced(nn.Module):
        """A row-parallel projection: its partial sums, all-reduced."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return all_reduce_op()(self.inner(x))

    class ReducedGatedNorm(nn.Module):
        """Mamba-2's gated RMS norm over one group spread across the ranks: the sum of squares
        of the rank's channels, all-reduced, over the whole group's width."""

        def __init__(self, norm, world):
            super().__init__()
            self.weight, self.variance_epsilon = norm.weight, norm.variance_epsilon
            self.world = world

        def forward(self, hidden_states, gate=None):
            dtype = hidden_states.dtype
            x = hidden_states.to(torch.float32)
            if gate is not None:
                x = x * nn.functional.silu(gate.to(torch.float32))
            squares = all_reduce_op()(x.pow(2).sum(-1, keepdim=True))
            x = x * torch.rsqrt(squares / (x.shape[-1] * self.world) + self.variance_epsilon)
            return self.weight * x.to(dtype)

    return Reduced, ReducedGatedNorm


def _reduce_output(module, name):
    """``module.name``'s output all-reduced (a ``Reduced`` wrapper in its place)."""
    setattr(module, name, _modules()[0](getattr(module, name)))


# module class -> how it is sharded; each family's shards checked against its whole model
RULES = {"MambaMixer": _mamba, "Mamba2Mixer": _mamba2,
         "BambaMixer": _mamba2, "BambaAttention": _attention, "BambaMLP": _mlp,
         "GraniteMoeHybridMambaLayer": _mamba2, "GraniteMoeHybridAttention": _attention,
         "GraniteMoeHybridMLP": _fused_mlp,
         "NemotronHMamba2Mixer": _mamba2, "NemotronHAttention": _attention, "NemotronHMLP": _mlp,
         "Zamba2MambaMixer": _mamba2,      # (Zamba2's shared attention block, with its adapters, replicated)
         "Qwen3NextGatedDeltaNet": _gated_deltanet, "Qwen3NextAttention": _attention, "Qwen3NextMLP": _mlp,
         "Qwen3_5GatedDeltaNet": _gated_deltanet, "Qwen3_5Attention": _attention, "Qwen3_5MLP": _mlp}
