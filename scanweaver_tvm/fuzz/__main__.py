"""``python -m scanweaver_tvm.fuzz``: the same as ``python -m bench.fuzz``."""
import sys

from .cli import main

sys.exit(main())
