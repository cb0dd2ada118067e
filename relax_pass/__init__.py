"""Relax passes of ScanWeaver.

``FuseAffineRecurrences`` (``fuse.py``) finds affine recurrences (``chains.py``, on the step
templates of ``steps.py``; Mamba's selective form in ``selective.py``; cumsum/cumprod in
``cumulative.py``) and replaces each with one scan call (``scan_op.py``); ``LowerScans``
(``lower.py``) turns those calls into ``call_tir`` of a scheduled PrimFunc from
``tir_schedules``.  Run them in that order, before TVM's default pipeline.
"""
from .fuse import FuseAffineRecurrences, analyze
from .lower import LowerScans

__all__ = ["FuseAffineRecurrences", "LowerScans", "analyze"]
