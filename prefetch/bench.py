"""Deprecated path: `prefetch.bench` moved to `prefetch.tools.bench` (same names)."""

import warnings

from prefetch.tools.bench import *  # noqa: F403
from prefetch.tools.bench import __all__  # noqa: F401

warnings.warn(
    "prefetch.bench is deprecated; import prefetch.tools.bench", DeprecationWarning, stacklevel=2
)
