"""``python -m bench.fuzz --count 1000 --seed 0 --out bench/out/fuzz``: differential fuzzing
of FuseAffineRecurrences (see ``scanweaver_tvm/fuzz``; ``--help`` for the options)."""
import sys

from scanweaver_tvm.fuzz.cli import main

if __name__ == "__main__":
    sys.exit(main())
