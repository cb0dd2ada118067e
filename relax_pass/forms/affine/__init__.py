"""Affine chains: ``h_t = a_t * h_{t-1} + b_t`` unrolled (found by ``relax_pass.chains``, planned
by ``relax_pass.plan.AffinePlan``), and ``cumsum``/``cumprod`` ops (``cumulative.py``)."""
