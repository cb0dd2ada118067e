"""Relax passes of ScanWeaver.

``FuseAffineRecurrences`` (``fuse.py``) tries the forms of ``fuse.FORMS`` in one order, one
subpackage of ``forms/`` per form (affine chains and cumsum/cumprod, selective, matrix,
chunked, stabilized, mLSTM, delta; each with its finder, near-miss reasons, plan kind and
emitter), and replaces each recurrence found with one scan call (``scan_op.py``); the machinery
they share (``chains``, ``steps``, ``lift``, ``interpret``, ``validate``, ``rewrite``, ``plan``)
is this package's top level.  ``LowerScans`` (``lower.py``) turns those calls into
``call_tir`` of a scheduled PrimFunc from ``tir_schedules``.  Run them in that order, before
TVM's default pipeline.
"""
from .fuse import FuseAffineRecurrences, analyze
from .lower import LowerScans

__all__ = ["FuseAffineRecurrences", "LowerScans", "analyze"]
