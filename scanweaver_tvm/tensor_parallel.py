"""Tensor-parallel layers: one rank's shard of a model, its mixers' channels split across the
ranks, compiled like any model (``compile_causal_lm(model, tensor_parallel=(rank, world))``).

As MLC-LLM shards by heads on Disco: the projections into a mixer are split by output
(column-parallel), the scan runs on the rank's channels only (a Mamba channel is a head of one
lane: its conv, its state, its decay are its own), and each projection that sums over the
channels (row-parallel) is followed by one all-reduce.  A Mamba mixer has two: ``x_proj`` (dt,
B and C read every channel) and ``out_proj``.  Embeddings, norms and the lm head are
replicated.  The shard is a copy of the model whose mixers hold their part of the weights; the
all-reduce is the torch op ``scanweaver::all_reduce``, traced, and in Relax the extern
``scanweaver.ccl.allreduce(send, recv)`` (laid out as ``R.ccl.allreduce``), which
``sequence_parallel.collective`` carries over torch.distributed (or between threads).

Every rank runs the same steps in lockstep (prefill, each decode step), and every rank ends with
the full logits.  Families are sharded by rule (``RULES``); another is refused, naming its mixer."""
import copy

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
    mixers = [(name, m) for name, m in out.named_modules() if type(m).__name__ in RULES]
    if not mixers:
        names = sorted({type(m).__name__ for m in out.modules() if "Mixer" in type(m).__name__ or
                        "Attention" in type(m).__name__})
        raise NotImplementedError(f"tensor_parallel: {type(model).__name__} has no mixer we shard "
                                  f"({', '.join(names) or 'none found'}; sharded: {', '.join(RULES)})")
    for _, mixer in mixers:
        RULES[type(mixer).__name__](mixer, rank, world)
    return out


def _rows(weight, parts, rank, world):
    """The rank's rows of ``weight`` split in ``parts`` equal blocks, each block cut in ``world``."""
    import torch

    return torch.cat([block.chunk(world)[rank] for block in weight.chunk(parts)])


def _mamba(mixer, rank, world):
    """Mamba-1: the inner channels split; ``x_proj`` and ``out_proj`` reduced."""
    import torch
    from torch import nn

    width = mixer.intermediate_size
    if width % world:
        raise ValueError(f"tensor_parallel: {width} inner channels do not split over {world} ranks")
    part = width // world
    keep = slice(rank * part, (rank + 1) * part)

    def linear(weight, bias):
        new = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None,
                        dtype=weight.dtype, device=weight.device)
        with torch.no_grad():
            new.weight.copy_(weight)
            if bias is not None:
                new.bias.copy_(bias)
        return new

    with torch.no_grad():
        in_proj, x_proj, dt_proj, out_proj, conv = (mixer.in_proj, mixer.x_proj, mixer.dt_proj, mixer.out_proj,
                                                    mixer.conv1d)
        mixer.in_proj = linear(_rows(in_proj.weight, 2, rank, world),
                               None if in_proj.bias is None else _rows(in_proj.bias, 2, rank, world))
        mixer.x_proj = linear(x_proj.weight[:, keep], None)
        mixer.dt_proj = linear(dt_proj.weight[keep], dt_proj.bias[keep])
        bias = None if out_proj.bias is None else (out_proj.bias if rank == 0 else torch.zeros_like(out_proj.bias))
        mixer.out_proj = linear(out_proj.weight[:, keep], bias)
        mixer.conv1d = nn.Conv1d(part, part, conv.kernel_size[0], groups=part, padding=conv.padding[0],
                                 bias=conv.bias is not None, dtype=conv.weight.dtype, device=conv.weight.device)
        mixer.conv1d.weight.copy_(conv.weight[keep])
        if conv.bias is not None:
            mixer.conv1d.bias.copy_(conv.bias[keep])
        mixer.A_log = nn.Parameter(mixer.A_log[keep].clone())
        mixer.D = nn.Parameter(mixer.D[keep].clone())
    mixer.intermediate_size = part
    _reduce_output(mixer, "x_proj")
    _reduce_output(mixer, "out_proj")


def _reduce_output(module, name):
    """``module.name``'s output all-reduced (a wrapper module in its place)."""
    from torch import nn

    class Reduced(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return all_reduce_op()(self.inner(x))

    setattr(module, name, Reduced(getattr(module, name)))


RULES = {"MambaMixer": _mamba}     # mixer class -> how it is sharded
