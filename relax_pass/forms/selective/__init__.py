"""Mamba's selective scan, read on an accepted affine chain over (B, D, N) states
(``selective.py``: its match, near-miss reason and operands; planned by ``relax_pass.plan.SelectivePlan``)."""
from ...form import ChainReading
from .selective import SelectiveMatch, match_selective

READING = ChainReading("selective", match_selective, SelectiveMatch)
