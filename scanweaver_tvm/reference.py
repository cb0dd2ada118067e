"""``scanweaver_tvm.reference``: the public path of ``scanweaver_core.reference`` (defined there, below every layer)."""
from scanweaver_core.reference import *  # noqa: F401,F403  # pylint: disable=wildcard-import,unused-wildcard-import
