"""Chunked and parallel regions of a matrix-state scan (Mamba-2's SSD, chunk-wise linear
attention, the (L, L) parallel form): found by what they compute (``chunked.py``, operand roles
in ``chunked_roles.py``, the parallel form in ``parallel_form.py``), emitted by ``chunked_emit.py``."""
