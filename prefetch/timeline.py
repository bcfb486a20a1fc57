"""Deprecated path: `prefetch.timeline` moved to `prefetch.tools.timeline` (same names)."""

import warnings

from prefetch.tools.timeline import (
    KIND_CHARS,
    KIND_COLOURS,
    MATPLOTLIB_HINT,
    TEXT_WIDTH,
    DecodeSpan,
    Span,
    TimedDecoder,
    Timeline,
    import_matplotlib,
)

__all__ = [
    "KIND_CHARS",
    "KIND_COLOURS",
    "MATPLOTLIB_HINT",
    "TEXT_WIDTH",
    "DecodeSpan",
    "Span",
    "TimedDecoder",
    "Timeline",
    "import_matplotlib",
]

warnings.warn(
    "prefetch.timeline is deprecated; import prefetch.tools.timeline",
    DeprecationWarning,
    stacklevel=2,
)
