"""The externs a parallel module calls: ``scanweaver.ccl.allgather(send, recv)`` (sequence
parallel: every rank's ``send`` concatenated along axis 0 in rank order into ``recv``, the
layout of ``R.ccl.allgather``, so a Disco/NCCL build can stand in for it), and
``scanweaver.ccl.allreduce(send, recv)`` (tensor parallel: the sum, as ``R.ccl.allreduce``).

torch.distributed carries the bytes: gloo on CPUs, NCCL on GPUs, in whatever process group the
caller set up (``torch.distributed.init_process_group``); without one, a single rank's gather
or sum is a copy.  ``in_threads`` runs ranks as threads of this process instead (the check a
split prefill gets at compile time, and tests).  TVM 0.27's Disco has no CPU collective
(``init_ccl`` takes nccl / rccl only), which is why this is torch's.  ``TRAFFIC`` counts what
this process contributed (``in_threads``: each rank's own), for the cost model's check."""
import threading
from dataclasses import dataclass

import tvm

from relax_pass.split.scan import ALLGATHER

from ..tensor_parallel import ALLREDUCE


@dataclass
class Traffic:
    """What this process sent through the extern: calls and payload bytes (its ``send``)."""

    calls: int = 0
    bytes_sent: int = 0

    def reset(self):
        self.calls, self.bytes_sent = 0, 0


TRAFFIC = Traffic()


class _ThreadGroup:
    """Ranks as threads: each all-gather waits at a barrier for every rank's vector."""

    def __init__(self, world, timeout_s, traffic):
        self.world, self.vectors, self.traffic = world, [None] * world, traffic
        self.barrier = threading.Barrier(world, timeout=timeout_s)

    def allgather(self, rank, src, dst):
        _count(self.traffic[rank], src)
        self.vectors[rank] = src.clone()
        self.barrier.wait()
        for r, x in enumerate(self.vectors):
            dst[r * x.shape[0]:(r + 1) * x.shape[0]].copy_(x)
        self.barrier.wait()          # (nobody overwrites a vector before every rank has read it)

    def all_reduce(self, rank, src):
        """The sum of every rank's ``src`` (added in rank order: the same on every rank)."""
        _count(self.traffic[rank], src)
        self.vectors[rank] = src.clone()
        self.barrier.wait()
        total = self.vectors[0].clone()
        for x in self.vectors[1:]:
            total += x
        self.barrier.wait()
        return total


_THREAD = threading.local()


def in_threads(world, work, timeout_s=300, traffic=None):
    """``[work(rank) for rank in range(world)]``, the ranks run at once as threads whose
    all-gathers meet in this process; ``traffic``: a list of ``world`` ``Traffic`` counting
    what each rank sent.  A rank's exception is raised here (the others' barrier breaks: no
    hang)."""
    traffic = traffic if traffic is not None else [Traffic() for _ in range(world)]
    group, results, errors = _ThreadGroup(world, timeout_s, traffic), [None] * world, []

    def run(rank):
        _THREAD.group, _THREAD.rank = group, rank
        try:
            results[rank] = work(rank)
        except BaseException as err:  # pylint: disable=broad-except
            errors.append(err)
            group.barrier.abort()
        finally:
            _THREAD.group = None

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def _count(traffic, src):
    traffic.calls += 1
    traffic.bytes_sent += src.numel() * src.element_size()


def _allgather(send, recv):
    import torch  # pylint: disable=import-outside-toplevel
    import torch.distributed as dist  # pylint: disable=import-outside-toplevel

    src, dst = torch.from_dlpack(send), torch.from_dlpack(recv)
    group = getattr(_THREAD, "group", None)
    if group is not None:
        group.allgather(_THREAD.rank, src, dst)
        return
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if dst.shape[0] != world * src.shape[0]:
        raise ValueError(f"{ALLGATHER}: the module was built for {dst.shape[0] // src.shape[0]} ranks, "
                         f"the process group has {world}")
    _count(TRAFFIC, src)
    if world == 1:
        dst.copy_(src)
        return
    dist.all_gather(list(dst.view(world, *src.shape).unbind(0)), src.contiguous())


def all_reduce(x):
    """The sum of every rank's ``x`` (a torch tensor): between the ranks' threads, over
    torch.distributed's default group, or alone (no group) ``x`` itself."""
    import torch.distributed as dist  # pylint: disable=import-outside-toplevel

    group = getattr(_THREAD, "group", None)
    if group is not None:
        return group.all_reduce(_THREAD.rank, x)
    _count(TRAFFIC, x)
    out = x.clone()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(out)
    return out


def _allreduce(send, recv):
    import torch  # pylint: disable=import-outside-toplevel

    torch.from_dlpack(recv).copy_(all_reduce(torch.from_dlpack(send)))


tvm.register_global_func(ALLGATHER, _allgather, override=True)
tvm.register_global_func(ALLREDUCE, _allreduce, override=True)
