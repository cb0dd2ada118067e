"""Max-stabilized scans (RWKV-4's WKV) read from an unrolled loop (``stabilized.py``)."""
