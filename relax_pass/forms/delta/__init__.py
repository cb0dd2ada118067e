"""Delta rules: an unrolled loop (``delta.py``) and the chunked UT form (``delta_chunked.py``)."""
