"""Differential fuzzing of FuseAffineRecurrences: random PyTorch models with recurrences (and
near misses), each compiled with and without the pass and compared with PyTorch.

``generate_case(seed)`` writes a model as source text with its expectation; ``check_case``
runs it (``check.py``); ``python -m bench.fuzz`` / ``cli.main(argv)`` runs many in parallel.
"""
from .generate import Case, generate_case, with_expect

__all__ = ["Case", "generate_case", "with_expect"]
