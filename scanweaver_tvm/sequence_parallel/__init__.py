"""Sequence-parallel scans: ranks hold consecutive parts of a sequence, each summarizes its part
(a transition and a state), one all-gather shares the summaries, and each finishes its part from
the state the parts before it leave (``module``).  torch.distributed carries the bytes
(``collective``); TVM computes."""
from .module import build, compile_part, layout
from .parts import split, split_operands, time_axes, view

__all__ = ["build", "compile_part", "layout", "split", "split_operands", "time_axes", "view"]
