"""The check shared by the ``tests/test_rewrites_*_forms.py`` files, which pin one rewrite per
form in ``Before``/``Expected`` style (TVM's): each ``Before`` is a small module as the torch
frontend imports it (``sw.from_torch`` of the loop in its docstring, printed), and ``Expected``
what ``FuseAffineRecurrences`` makes of it, printed once and pinned there.  The rewrite is
deterministic: validation probes the rewrite with seeded random inputs but only accepts or
refuses it, so a refusal would show as ``Expected`` not matching (the module left as it was).
``analyze`` pins which form wins."""
import tvm

from relax_pass import FuseAffineRecurrences, analyze


def _check(before, expected, form):
    found = analyze(before)
    assert [(r.form, r.rejected) for r in found] == [(form, False)], found
    tvm.ir.assert_structural_equal(FuseAffineRecurrences()(before), expected)
