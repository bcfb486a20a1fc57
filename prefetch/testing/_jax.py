"""A fake `jax` module for the multi-process JAX jobs that a test machine cannot run.

A fault-injection fake in the sense of the other fakes: it injects an environment (JAX's
distributed runtime initialised, this process being one of several), not a result.
`prefetch.keras.jax_processes` decides from it whether and how to shard. A real two-process
job runs too (tests/test_keras_multiprocess.py: JAX is in the `test` extra); the fake stands
for what that job cannot show: an older JAX without `is_initialized`, a job that initialised
itself, a backend that must not be started. Install it in a process of its own
(`sys.modules["jax"] = fake_jax(...)`, after Keras is imported: Keras probes a `jax` module it
finds at import), never in the test runner.
"""

from __future__ import annotations

import types


class BackendStarted(RuntimeError):
    """Raised by a fake whose backend must not be asked for (`backend_allowed=False`)."""


def fake_jax(
    process_count: int,
    process_index: int,
    *,
    initialized: bool | None = True,
    backend_allowed: bool = True,
) -> types.ModuleType:
    """A module with JAX's process API: `process_count()`, `process_index()` and
    `distributed.is_initialized()` (absent with `initialized=None`, as before JAX 0.5.1).
    With `backend_allowed=False`, `process_count` and `process_index` raise `BackendStarted`:
    in real JAX they start the accelerator backend, which a caller must not do unasked."""
    jax = types.ModuleType("jax")
    distributed = types.ModuleType("jax.distributed")
    if initialized is not None:
        distributed.is_initialized = lambda: initialized  # type: ignore[attr-defined]
    jax.distributed = distributed  # type: ignore[attr-defined]

    def ask(value: int) -> int:
        if not backend_allowed:
            raise BackendStarted("the fake JAX's backend was started (process_count/index)")
        return value

    jax.process_count = lambda: ask(process_count)  # type: ignore[attr-defined]
    jax.process_index = lambda: ask(process_index)  # type: ignore[attr-defined]
    return jax
