"""Sequence-parallel scans: ranks hold consecutive parts of a sequence, each summarizes its part
(a transition and a state), one all-gather shares the summaries, and each finishes its part from
the state the parts before it leave (``relax_pass.split``).  torch.distributed carries the
bytes (``collective``); TVM computes.  ``cost``: the bytes and time on paper; ``check``: the
torchrun command that runs one against one process."""
from relax_pass.split.scan import build, layout
from scanweaver_core.sequence_parts import split, split_operands, time_axes, view

from .run import compile_part, run_part

__all__ = ["build", "compile_part", "layout", "run_part", "split", "split_operands", "time_axes", "view"]
