"""The one extern a sequence-parallel module calls, ``scanweaver.ccl.allgather(send, recv)``:
every rank's ``send`` concatenated along axis 0 in rank order into ``recv`` (the layout of
``R.ccl.allgather``, so a Disco/NCCL build can stand in for it).

torch.distributed carries the bytes: gloo on CPUs, NCCL on GPUs, in whatever process group the
caller set up (``torch.distributed.init_process_group``); without one, a single rank's gather is
a copy.  TVM 0.27's Disco has no CPU collective (``init_ccl`` takes nccl / rccl only), which is
why this is torch's.  ``TRAFFIC`` counts what this process contributed, for the cost model's
check."""
from dataclasses import dataclass

import tvm

ALLGATHER = "scanweaver.ccl.allgather"


@dataclass
class Traffic:
    """What this process sent through the extern: calls and payload bytes (its ``send``)."""

    calls: int = 0
    bytes_sent: int = 0

    def reset(self):
        self.calls, self.bytes_sent = 0, 0


TRAFFIC = Traffic()


def _allgather(send, recv):
    import torch  # pylint: disable=import-outside-toplevel
    import torch.distributed as dist  # pylint: disable=import-outside-toplevel

    src, dst = torch.from_dlpack(send), torch.from_dlpack(recv)
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if dst.shape[0] != world * src.shape[0]:
        raise ValueError(f"{ALLGATHER}: the module was built for {dst.shape[0] // src.shape[0]} ranks, "
                         f"the process group has {world}")
    TRAFFIC.calls += 1
    TRAFFIC.bytes_sent += src.numel() * src.element_size()
    if world == 1:
        dst.copy_(src)
        return
    dist.all_gather(list(dst.view(world, *src.shape).unbind(0)), src.contiguous())


tvm.register_global_func(ALLGATHER, _allgather, override=True)
