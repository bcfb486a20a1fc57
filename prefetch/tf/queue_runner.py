"""QueueRunner: a `tf.queue` fed from a Loader by Coordinator-registered threads.

Contract:
- One element of the queue is one sample: each loader batch goes in with `enqueue_many`, so
  `dequeue()` takes a sample and `dequeue_many(n)` / `dequeue_up_to(n)` re-batch at any `n`.
- `create_threads(sess, coord)` makes two threads, both registered with `coord`: the feeder
  (iterates the loader for `num_epochs` epochs, enqueues, checks `coord.should_stop()` between
  batches, reports an error with `coord.request_stop`) and the closer (on a stop request, closes
  the queue with `cancel_pending_enqueues=True`, which wakes a feeder blocked on a full queue).
  The feeder closes the queue whenever it ends; after the last epoch without cancelling, so
  consumers drain what is left and then get `tf.errors.OutOfRangeError`.
- Eager TF2 (ops run directly; `dequeue*` also work inside `tf.function`) or tf.compat.v1 graph
  mode (the feeder runs a prebuilt enqueue op through `sess.run` with placeholders), chosen by
  the mode in force when the runner is built. The runner does not own the loader: wrap the
  training in `with loader:` to keep its workers across epochs. Thread-safe as TF queues are.
See docs/tensorflow.md ("QueueRunner") for usage and the TF1 migration.
"""

from __future__ import annotations

import itertools
import logging
import sys
import threading
from collections.abc import Iterator
from typing import Any, Protocol

import tensorflow as tf

from prefetch._messages import suggest_keywords
from prefetch.coordinator import POLL_S
from prefetch.runtime import Loader
from prefetch.tf._dataset import output_signature

log = logging.getLogger(__name__)

# The queue types a runner can build, by the name the `queue` argument takes.
QUEUE_KINDS: dict[str, Any] = {
    "fifo": tf.queue.FIFOQueue,
    "random_shuffle": tf.queue.RandomShuffleQueue,
    "padding_fifo": tf.queue.PaddingFIFOQueue,
}
# The default capacity, in batches of the loader (the queue holds samples).
DEFAULT_CAPACITY_BATCHES = 2


class CoordinatorLike(Protocol):
    """What the runner needs of a coordinator: `prefetch.Coordinator` or `tf.train.Coordinator`."""

    def should_stop(self) -> bool: ...

    def request_stop(self, ex: Any = None) -> None: ...

    def wait_for_stop(self, timeout: float | None = None) -> bool: ...

    def register_thread(self, thread: Any) -> None: ...


def _queue_class(queue: Any) -> tuple[str, Any]:
    """The (kind, class) named by `queue`: a key of QUEUE_KINDS or one of those classes."""
    for kind, cls in QUEUE_KINDS.items():
        if queue == kind or queue is cls:
            return kind, cls
    raise ValueError(
        f"queue must be one of {tuple(QUEUE_KINDS)} (or tf.queue.FIFOQueue, RandomShuffleQueue, "
        f"PaddingFIFOQueue), got {queue!r}"
    )


@suggest_keywords
class QueueRunner:
    """A `tf.queue` of samples, fed from `loader` by threads that a Coordinator stops.

    Start it with `create_threads` (or `tf.compat.v1.train.add_queue_runner` and
    `start_queue_runners`), and take samples with `dequeue`, `dequeue_many` or
    `dequeue_up_to`.

    Parameters:

    - `loader`: the `Loader` whose batches are split into samples and enqueued.
    - `queue`: `"fifo"` (samples in the loader's order), `"random_shuffle"` (sampled at random
      from what is queued, at least `min_after_dequeue` left behind until the end) or
      `"padding_fifo"`; the `tf.queue` classes are accepted too.
    - `capacity`: the most samples the queue holds (default: two loader batches).
    - `num_epochs`: `None` feeds epochs until a stop; an int feeds that many epochs of the
      loader, then closes the queue, so that `dequeue*` raise `tf.errors.OutOfRangeError`
      once it is empty.
    - `min_after_dequeue`: with `"random_shuffle"`, the samples left behind by a dequeue
      (until the end), for mixing; default half the capacity.
    - `seed`: with `"random_shuffle"`, the queue's random seed.
    - `name`: the queue's name in the graph.
    """

    def __init__(
        self,
        loader: Loader,
        *,
        queue: Any = "fifo",
        capacity: int | None = None,
        num_epochs: int | None = None,
        min_after_dequeue: int | None = None,
        seed: int | None = None,
        name: str = "prefetch_queue",
    ) -> None:
        if not isinstance(loader, Loader):
            raise TypeError(f"loader must be a prefetch.Loader, got {type(loader).__name__}")
        self.loader = loader
        self.kind, queue_class = _queue_class(queue)
        if capacity is None:
            capacity = DEFAULT_CAPACITY_BATCHES * loader.options.batch_size
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an int >= 1 (samples), got {capacity!r}")
        self.capacity = capacity
        if num_epochs is not None and (
            isinstance(num_epochs, bool) or not isinstance(num_epochs, int) or num_epochs < 1
        ):
            raise ValueError(f"num_epochs must be None (no end) or an int >= 1, got {num_epochs!r}")
        self.num_epochs = num_epochs
        self.name = name
        signature = output_signature(loader)
        self._labelled = loader.options.label_mode is not None
        batch_specs = list(signature) if self._labelled else [signature]
        self.element_spec: tuple[tf.TensorSpec, ...] = tuple(
            tf.TensorSpec(spec.shape[1:], spec.dtype, name=spec.name) for spec in batch_specs
        )
        dtypes = [spec.dtype for spec in self.element_spec]
        shapes = [spec.shape for spec in self.element_spec]
        if self.kind == "random_shuffle":
            if min_after_dequeue is None:
                min_after_dequeue = capacity // 2
            if not 0 <= min_after_dequeue < capacity:
                raise ValueError(
                    f"min_after_dequeue must be in [0, capacity={capacity}), got "
                    f"{min_after_dequeue}; lower it or raise capacity"
                )
            self.queue = queue_class(
                capacity, min_after_dequeue, dtypes, shapes=shapes, seed=seed, name=name
            )
        else:
            if min_after_dequeue is not None or seed is not None:
                raise ValueError(
                    f"min_after_dequeue and seed apply only to queue='random_shuffle', not "
                    f"{self.kind!r}"
                )
            self.queue = queue_class(capacity, dtypes, shapes=shapes, name=name)
        self.eager = tf.executing_eagerly()
        self._graph: Any = None
        if not self.eager:
            self._graph = tf.compat.v1.get_default_graph()
            self._placeholders = [
                tf.compat.v1.placeholder(spec.dtype, [None, *spec.shape], name=f"{name}_feed")
                for spec in self.element_spec
            ]
            self._enqueue_op = self.queue.enqueue_many(self._placeholders)
            self._close_op = self.queue.close(cancel_pending_enqueues=False)
            self._cancel_op = self.queue.close(cancel_pending_enqueues=True)
        self._lock = threading.Lock()
        self._started = False

    # ---- consumer side ---------------------------------------------------------------

    def _structure(self, tensors: Any) -> Any:
        """(images, labels) for a labelled loader, else the images tensor."""
        if isinstance(tensors, (list, tuple)):
            return tuple(tensors) if self._labelled else tensors[0]
        return tensors

    def dequeue(self, name: str | None = None) -> Any:
        """One sample: `(image, label)`, or the image alone with `label_mode=None`.

        Blocks until a sample is queued; raises `tf.errors.OutOfRangeError` once the queue is
        closed and empty. Eagerly it returns tensors; in a `tf.function` or a graph, it builds
        the op.
        """
        return self._structure(self.queue.dequeue(name=name))

    def dequeue_many(self, n: int, name: str | None = None) -> Any:
        """`n` samples stacked as one batch, like `dequeue` with a leading dimension of `n`.

        Raises `tf.errors.OutOfRangeError` once the queue is closed with fewer than `n` samples
        left (those are not returned; use `dequeue_up_to` to take them).
        """
        return self._structure(self.queue.dequeue_many(n, name=name))

    def dequeue_up_to(self, n: int, name: str | None = None) -> Any:
        """Like `dequeue_many(n)`, but after the close returns the last, shorter batch.

        Raises `tf.errors.OutOfRangeError` once the queue is closed and empty.
        """
        return self._structure(self.queue.dequeue_up_to(n, name=name))

    def size(self, name: str | None = None) -> Any:
        """The number of samples in the queue (a tensor, or an op in a graph)."""
        return self.queue.size(name=name)

    # ---- producer side ---------------------------------------------------------------

    def create_threads(
        self,
        sess: Any = None,
        coord: CoordinatorLike | None = None,
        daemon: bool = False,
        start: bool = False,
    ) -> list[threading.Thread]:
        """Create the feeder and closer threads, register them with `coord`, maybe start them.

        The signature of `tf.compat.v1.train.QueueRunner.create_threads`. `sess`: None in eager
        mode; in graph mode, the `tf.compat.v1.Session` of the graph the runner was built in.
        `coord` is required (`prefetch.Coordinator` or `tf.train.Coordinator`): a stop request
        is what ends the feeder early, and `coord.join()` re-raises its error. A runner feeds
        once: its queue stays closed afterwards, so a second call raises `RuntimeError`.
        """
        if coord is None:
            raise ValueError(
                "coord is required: pass a prefetch.Coordinator (or tf.train.Coordinator), "
                "which stops the feeder and re-raises its errors from coord.join()"
            )
        if self.eager and sess is not None:
            raise ValueError("this QueueRunner was built in eager mode: pass sess=None")
        if not self.eager:
            if sess is None:
                raise ValueError(
                    "this QueueRunner was built in graph mode: pass the tf.compat.v1.Session "
                    "that runs its graph as sess"
                )
            if sess.graph is not self._graph:
                raise ValueError(
                    "sess runs another graph than the one this QueueRunner was built in; "
                    "build the runner inside that graph"
                )
        with self._lock:
            if self._started:
                raise RuntimeError(
                    f"QueueRunner {self.name!r} has already fed its queue, which is closed; "
                    "build a new QueueRunner to feed again"
                )
            self._started = True
        feeder = threading.Thread(
            target=self._feed, args=(sess, coord), name=f"QueueRunner-{self.name}-feeder"
        )
        closer = threading.Thread(
            target=self._close_on_stop,
            args=(sess, coord, feeder),
            name=f"QueueRunner-{self.name}-close_on_stop",
        )
        threads = [feeder, closer]
        for thread in threads:
            coord.register_thread(thread)
            thread.daemon = daemon
            if start:
                thread.start()
        return threads

    def _enqueue(self, sess: Any, batch: Any) -> None:
        arrays = [batch.images, batch.labels] if self._labelled else [batch.images]
        if self.eager:
            self.queue.enqueue_many(arrays)
        else:
            sess.run(self._enqueue_op, feed_dict=dict(zip(self._placeholders, arrays, strict=True)))

    def _close(self, sess: Any, cancel_pending_enqueues: bool) -> None:
        """Close the queue; errors (a closed session) are logged, not raised."""
        try:
            if self.eager:
                self.queue.close(cancel_pending_enqueues=cancel_pending_enqueues)
            else:
                sess.run(self._cancel_op if cancel_pending_enqueues else self._close_op)
        except Exception as error:  # the session may be gone; nothing is left to wake then
            log.debug("QueueRunner %s: closing the queue failed: %r", self.name, error)

    def _epochs(self) -> Iterator[int]:
        return iter(range(self.num_epochs)) if self.num_epochs is not None else itertools.count()

    def _feed(self, sess: Any, coord: CoordinatorLike) -> None:
        """The feeder thread: enqueue every batch of `num_epochs` epochs, then close the queue."""
        finished = False
        try:
            for _ in self._epochs():
                batches = iter(self.loader)
                try:
                    for batch in batches:
                        if coord.should_stop():
                            return
                        self._enqueue(sess, batch)
                        del batch  # the loader reuses the batch's buffer once nothing holds it
                finally:
                    getattr(batches, "close", lambda: None)()  # stop this epoch's workers now
                if coord.should_stop():
                    return
            finished = True
        except tf.errors.CancelledError:
            # The queue was closed under a blocked enqueue: by the closer after a stop, or by
            # hand. Either way nothing more can be fed, and this is not an error.
            log.debug("QueueRunner %s: the queue was closed; the feeder ends", self.name)
        except BaseException:
            coord.request_stop(sys.exc_info())  # before the close, so join() sees the error
        finally:
            self._close(sess, cancel_pending_enqueues=not finished)

    def _close_on_stop(self, sess: Any, coord: CoordinatorLike, feeder: threading.Thread) -> None:
        """The closer thread: on a stop request, cancel the feeder's pending enqueue."""
        while feeder.is_alive() or not feeder.ident:
            if coord.wait_for_stop(POLL_S):
                self._close(sess, cancel_pending_enqueues=True)
                return
        # The feeder ended on its own; it closed the queue itself.

    def __repr__(self) -> str:
        return (
            f"QueueRunner({self.loader!r}, queue={self.kind!r}, capacity={self.capacity}, "
            f"num_epochs={self.num_epochs})"
        )
