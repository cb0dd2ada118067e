"""How much of FuseAffineRecurrences' time its translation validation takes.

``python -m bench.validation [--lengths 256 1024]``: the demo's Mamba block imported at each L,
then the pass timed as a whole and the validation of each rewrite (``Recurrence.validation_s``)
read from its report.  Both are measured in the same run, so the ratio is the number to read.
"""
import argparse
import time

import scanweaver_tvm as sw
from relax_pass.fuse import fuse
from scanweaver_tvm import models


def measure(length):
    model, args = models.mamba_block(length=length)
    mod = sw.from_torch(model, args)
    start = time.perf_counter()
    _, recurrences = fuse(mod)
    total = time.perf_counter() - start
    validation = sum(r.validation_s or 0.0 for r in recurrences)
    return total, validation, recurrences


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024])
    lengths = parser.parse_args().lengths
    measure(16)                     # warm-up: first-use costs (imports, kernels) land here
    print("| L | pass (s) | validation (s) | share |")
    print("|---|---|---|---|")
    for length in lengths:
        total, validation, recs = measure(length)
        accepted = [r for r in recs if not r.rejected]
        print(f"| {length} | {total:.2f} | {validation:.2f} | {validation / total:.0%} |"
              f"  <!-- {len(accepted)} accepted: {[r.form for r in accepted]} -->")


if __name__ == "__main__":
    main()
