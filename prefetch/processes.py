"""Deprecated path: the errors that lived here are in `prefetch.errors` (and `prefetch`).

`from prefetch.processes import WorkerCrashedError` keeps working, with a DeprecationWarning;
the process backend itself is `prefetch.backends.processes`.
"""

import warnings

from prefetch.errors import RemoteTraceback as RemoteTraceback
from prefetch.errors import WorkerCrashedError as WorkerCrashedError

warnings.warn(
    "prefetch.processes is deprecated; import WorkerCrashedError from prefetch (or "
    "prefetch.errors)",
    DeprecationWarning,
    stacklevel=2,
)
