"""``scanweaver_tvm.spec``: the public path of ``scanweaver_core.spec`` (defined there, below every layer)."""
from scanweaver_core.spec import *  # noqa: F401,F403  # pylint: disable=wildcard-import,unused-wildcard-import
