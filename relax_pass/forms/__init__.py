"""The forms ``FuseAffineRecurrences`` turns into scans, one subpackage per form.

Each holds its finder (what it reads, and the near-miss reasons when a candidate is not one),
its match, and its emitter; ``relax_pass.fuse.FORMS`` lists the forms in the one order the
driver tries them, and ``relax_pass.plan.PLAN_KINDS`` the plan kind of each.  The machinery
they share (``steps``, ``lift``, ``interpret``, ``validate``, ``rewrite``, ...) is the top
level of ``relax_pass``.

- ``affine``: unrolled affine chains (found by ``relax_pass.chains``) and ``cumsum``/``cumprod``;
- ``selective``: Mamba's selective scan, read on an affine chain;
- ``matrix``: matrix-state scans per step, in whole-sequence form, and split readout einsums;
- ``chunked``: chunked and parallel (L, L) regions of a matrix scan (Mamba-2's SSD, linear attention);
- ``stabilized``: max-stabilized scans (RWKV-4's WKV);
- ``mlstm``: xLSTM's mLSTM, as a loop and chunkwise;
- ``delta``: delta rules, as a loop and in chunked (UT) form.
"""
