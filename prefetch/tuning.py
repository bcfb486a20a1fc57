"""Deprecated path: `prefetch.tuning` moved to `prefetch.tools.tune` (same names)."""

import warnings

from prefetch.tools.tune import KEPT_UP_WAIT, TOLERANCE, TRIAL_BATCHES, Trial, TuneReport, tune

__all__ = ["KEPT_UP_WAIT", "TOLERANCE", "TRIAL_BATCHES", "Trial", "TuneReport", "tune"]

warnings.warn(
    "prefetch.tuning is deprecated; import prefetch.tools.tune", DeprecationWarning, stacklevel=2
)
