"""background(iterable, depth): run any iterable ahead of its consumer in a daemon thread.

One producer thread fills a bounded queue (`depth` items), so the producer runs at most `depth`
items ahead and memory stays bounded. Items come out in order. A producer exception is re-raised
at the consumer with its original type and traceback. `close()`, breaking out of a `for` loop,
or dropping the iterator stops the producer at its next item; nothing blocks forever, because
every queue operation loops on a short timeout and re-checks the stop flag.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Generic, TypeVar

from prefetch.coordinator import POLL_S
from prefetch.errors import ClosedError

log = logging.getLogger(__name__)

T = TypeVar("T")

# How long close() waits for the producer to finish the item it is computing.
CLOSE_TIMEOUT_S = 5.0


class _End:
    """End-of-stream sentinel: the iterable is exhausted."""


class _Failed:
    """The producer raised; carries the exception for the consumer."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _produce(iterable: Iterable[T], items: queue.Queue[object], stop: threading.Event) -> None:
    """Producer thread body. Holds no reference to the Background object, so it can be freed."""
    iterator = iter(iterable)
    try:
        for item in iterator:
            if not _put(items, item, stop):
                return
        _put(items, _End(), stop)
    except BaseException as error:
        _put(items, _Failed(error), stop)
    finally:
        close = getattr(iterator, "close", None)
        if stop.is_set() and close is not None:
            try:
                close()
            except Exception:  # the consumer has gone; nobody else can see this
                log.exception("closing the background iterable failed")


def _put(items: queue.Queue[object], item: object, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            items.put(item, timeout=POLL_S)
            return True
        except queue.Full:
            continue
    return False


class Background(Iterator[T], Generic[T]):
    """The iterator returned by `background()`; also a context manager that closes it.

    - `iterable`: what the producer thread iterates.
    - `depth`: the most items produced ahead of the consumer, an int >= 1.
    - `name`: the producer thread's name (`"prefetch-background"`), as `threading` shows it.
    """

    def __init__(self, iterable: Iterable[T], depth: int = 2, name: str = "prefetch-background"):
        self._stop = threading.Event()
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self._items: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._done = False
        self._thread = threading.Thread(
            target=_produce, args=(iterable, self._items, self._stop), name=name, daemon=True
        )
        self._thread.start()

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        while True:
            try:
                item = self._items.get(timeout=POLL_S)
                break
            except queue.Empty:
                if self._stop.is_set():  # close() ran in another thread while we waited
                    raise ClosedError(
                        "the background iterator was closed while an item was being waited for"
                    ) from None
                if not self._thread.is_alive() and self._items.empty():
                    self.close()
                    raise RuntimeError("the background producer thread died unexpectedly") from None
        if isinstance(item, _End):
            self.close()
            raise StopIteration
        if isinstance(item, _Failed):
            self.close()
            raise item.error
        return item  # type: ignore[return-value]

    def close(self) -> None:
        """Stop the producer and wait (briefly) for its thread to end. Idempotent."""
        self._done = True
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(CLOSE_TIMEOUT_S)
            if self._thread.is_alive():
                log.warning(
                    "background producer %s is still computing an item after %.0f s; it stops "
                    "after that item (it is a daemon thread)",
                    self._thread.name,
                    CLOSE_TIMEOUT_S,
                )

    def __enter__(self) -> Background[T]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        # A dropped iterator (a `for` loop left with break) stops its producer.
        self._stop.set()


def background(iterable: Iterable[T], depth: int = 2) -> Background[T]:
    """Iterate `iterable` in a daemon thread, at most `depth` items ahead of the consumer.

    Use it to load the next batch while the current one trains:

        for batch in prefetch.background(batches(), depth=2):
            train_step(batch)

    Items arrive in order; a producer exception is raised at the consumer with its original
    type and traceback. Breaking out early, `close()`, or leaving a `with` block stops the
    producer promptly (a generator is closed, so its `finally` blocks run).

    - `iterable`: any iterable (a generator, a list, an iterator of your own); it is iterated
      in a daemon thread, and a generator is closed when the consumer stops early.
    - `depth`: the most items produced ahead of the consumer, an int >= 1 (the bound on
      memory).
    """
    return Background(iterable, depth)
