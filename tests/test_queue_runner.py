"""prefetch.tf.QueueRunner: a tf.queue fed from a Loader by Coordinator-registered threads.

Every test feeds a real queue from a real Loader (worker threads decoding JPEGs written into a
tmp dir), consumes it eagerly or in a tf.function, and stops every thread it starts, so the
leak check in conftest.py passes. The tf.compat.v1 Session mode runs in a subprocess, because
disabling eager execution is process-wide.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import prefetch
from prefetch.testing import FailingDecoder, small_cnn, write_image_folder

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

# Loader options shared by the tests: 21 samples in batches of 4 (the last epoch batch is short).
OPTIONS: dict[str, Any] = dict(batch_size=4, image_size=(12, 12), workers=2, seed=7)
EPOCHS = 3
# How long a test waits for the feeder to fill the queue before failing.
FILL_DEADLINE_S = 20.0


class InjectedDecodeError(Exception):
    """A decode error type that only this test module raises."""


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_image_folder(tmp_path_factory.mktemp("shapes"), per_class=7, size=(20, 20))


def reference_samples(folder: Path, epochs: int, **options: Any) -> list[tuple[bytes, int]]:
    """(image bytes, label) of every sample the loader yields over `epochs`, in order."""
    loader = prefetch.Loader(folder, **{**OPTIONS, **options})
    samples = []
    with loader:
        for _ in range(epochs):
            for images, labels in loader:
                samples += [(x.tobytes(), int(y)) for x, y in zip(images, labels, strict=True)]
    return samples


def drain(take: Callable[[], Any]) -> list[tuple[bytes, int]]:
    """Call `take()` (a batch of (images, labels)) until OutOfRangeError; the samples in order."""
    samples = []
    with pytest.raises(tf.errors.OutOfRangeError):
        while True:
            images, labels = take()
            samples += [
                (x.tobytes(), int(y)) for x, y in zip(images.numpy(), labels.numpy(), strict=True)
            ]
    return samples


def feed_and_drain(folder: Path, **runner_options: Any) -> list[tuple[bytes, int]]:
    """Feed EPOCHS epochs through a QueueRunner, dequeue_up_to(5) in a tf.function to the end."""
    loader = prefetch.Loader(folder, **OPTIONS)
    runner = prefetch.tf.QueueRunner(loader, num_epochs=EPOCHS, **runner_options)
    take = tf.function(lambda: runner.dequeue_up_to(5))
    coord = prefetch.Coordinator()
    with loader:
        threads = runner.create_threads(coord=coord, start=True)
        samples = drain(take)
        coord.join()
    assert not any(thread.is_alive() for thread in threads)
    return samples


def test_a_fifo_queue_delivers_every_sample_exactly_once_in_order_for_several_epochs(
    folder: Path,
) -> None:
    expected = reference_samples(folder, EPOCHS)
    assert len(expected) == EPOCHS * 21
    got = feed_and_drain(folder, capacity=6)
    assert got == expected


def test_a_random_shuffle_queue_delivers_the_same_samples_in_another_order(folder: Path) -> None:
    expected = reference_samples(folder, EPOCHS)
    got = feed_and_drain(folder, queue="random_shuffle", capacity=16, min_after_dequeue=8, seed=1)
    assert collections.Counter(got) == collections.Counter(expected)
    assert got != expected


def test_a_padding_fifo_queue_works_and_the_tf_queue_class_names_a_queue(folder: Path) -> None:
    expected = reference_samples(folder, EPOCHS)
    assert feed_and_drain(folder, queue="padding_fifo") == expected
    runner = prefetch.tf.QueueRunner(
        prefetch.Loader(folder, **OPTIONS), queue=tf.queue.PaddingFIFOQueue
    )
    assert runner.kind == "padding_fifo"
    assert isinstance(runner.queue, tf.queue.PaddingFIFOQueue)


def test_dequeue_and_dequeue_many_work_inside_tf_function(folder: Path) -> None:
    loader = prefetch.Loader(folder, **OPTIONS, label_mode="categorical")
    runner = prefetch.tf.QueueRunner(loader, num_epochs=1, capacity=8)
    assert [spec.shape.as_list() for spec in runner.element_spec] == [[12, 12, 3], [3]]

    @tf.function
    def one_then_many() -> Any:
        image, label = runner.dequeue()
        images, labels = runner.dequeue_many(6)
        return image, label, images, labels, runner.size()

    coord = prefetch.Coordinator()
    with loader, coord:
        runner.create_threads(coord=coord, start=True)
        image, label, images, labels, size = one_then_many()
    assert image.shape == (12, 12, 3) and image.dtype == tf.uint8
    assert label.shape == (3,) and label.dtype == tf.float32
    assert images.shape == (6, 12, 12, 3) and labels.shape == (6, 3)
    assert 0 <= int(size) <= 8


def test_an_unlabelled_loader_gives_images_alone(folder: Path) -> None:
    loader = prefetch.Loader(folder, **OPTIONS, label_mode=None)
    runner = prefetch.tf.QueueRunner(loader, num_epochs=1)
    coord = prefetch.Coordinator()
    with loader, coord:
        runner.create_threads(coord=coord, start=True)
        images = runner.dequeue_many(21)
    assert images.shape == (21, 12, 12, 3)


def test_a_stop_wakes_a_feeder_blocked_on_a_full_queue(folder: Path) -> None:
    loader = prefetch.Loader(folder, **OPTIONS)
    # A batch of 4 cannot fit in 2 places: the feeder blocks inside enqueue_many.
    runner = prefetch.tf.QueueRunner(loader, capacity=2)
    coord = prefetch.Coordinator()
    with loader:
        feeder, closer = runner.create_threads(coord=coord, start=True)
        deadline = time.monotonic() + FILL_DEADLINE_S
        while int(runner.size()) < 2:
            assert time.monotonic() < deadline, "the feeder never filled the queue"
            time.sleep(0.01)
        assert feeder.is_alive() and closer.is_alive()
        coord.request_stop()
        coord.join(stop_grace_period_secs=10)  # raises RuntimeError if a thread is left
    assert not feeder.is_alive() and not closer.is_alive()
    # What was queued before the stop can still be taken; then the queue reports its end.
    assert len(runner.dequeue_up_to(10)[1]) == 2
    with pytest.raises(tf.errors.OutOfRangeError):
        runner.dequeue()


def test_the_end_of_data_raises_out_of_range_which_the_coordinator_takes_as_a_clean_stop(
    folder: Path,
) -> None:
    loader = prefetch.Loader(folder, **OPTIONS)
    runner = prefetch.tf.QueueRunner(loader, num_epochs=2)
    coord = prefetch.Coordinator()
    taken = 0
    with loader:
        runner.create_threads(coord=coord, start=True)
        with coord.stop_on_exception():  # the TF1 loop: stop on the first error
            while not coord.should_stop():
                taken += int(tf.shape(runner.dequeue_many(6)[1])[0])
        coord.join()  # raises nothing: OutOfRangeError is a clean stop
    assert coord.should_stop()
    # dequeue_many(6) takes all 42 samples of the two epochs in 7 batches.
    assert taken == 42


def test_a_decode_error_reaches_coord_join_with_its_original_type(folder: Path) -> None:
    decoder = FailingDecoder("square_0003", error=InjectedDecodeError)
    loader = prefetch.Loader(folder, **OPTIONS, decoder=decoder)
    runner = prefetch.tf.QueueRunner(loader, num_epochs=2)
    coord = prefetch.Coordinator()
    with loader:
        runner.create_threads(coord=coord, start=True)
        # The consumer sees the queue end early (the feeder closed it) ...
        taken = drain(lambda: runner.dequeue_up_to(4))
        # ... and join() raises the decoder's own error, with the loader's note naming the file.
        with pytest.raises(InjectedDecodeError, match="injected failure") as raised:
            coord.join()
    assert len(taken) < 21
    assert "square_0003" in "\n".join(getattr(raised.value, "__notes__", []))


def test_bad_arguments_raise_errors_that_name_the_argument(folder: Path) -> None:
    loader = prefetch.Loader(folder, **OPTIONS)
    with pytest.raises(ValueError, match="queue must be one of"):
        prefetch.tf.QueueRunner(loader, queue="lifo")
    with pytest.raises(ValueError, match="capacity must be an int >= 1"):
        prefetch.tf.QueueRunner(loader, capacity=0)
    with pytest.raises(ValueError, match="num_epochs must be None"):
        prefetch.tf.QueueRunner(loader, num_epochs=0)
    with pytest.raises(ValueError, match="min_after_dequeue must be in"):
        prefetch.tf.QueueRunner(loader, queue="random_shuffle", capacity=4, min_after_dequeue=4)
    with pytest.raises(ValueError, match="only to queue='random_shuffle'"):
        prefetch.tf.QueueRunner(loader, min_after_dequeue=1)
    with pytest.raises(TypeError, match=r"loader must be a prefetch\.Loader"):
        prefetch.tf.QueueRunner(str(folder))  # type: ignore[arg-type]
    runner = prefetch.tf.QueueRunner(loader, num_epochs=1)
    with pytest.raises(ValueError, match="coord is required"):
        runner.create_threads()
    with pytest.raises(ValueError, match="eager mode: pass sess=None"):
        runner.create_threads(object(), prefetch.Coordinator())
    coord = prefetch.Coordinator()
    with loader, coord:
        runner.create_threads(coord=coord, start=True)
        with pytest.raises(RuntimeError, match="already fed its queue"):
            runner.create_threads(coord=coord)


V1_SESSION_SCRIPT = """
import json
import sys

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_eager_execution()
import prefetch
import prefetch.tf

folder, out = sys.argv[1], sys.argv[2]
options = json.loads(sys.argv[3])
options["image_size"] = tuple(options["image_size"])
report = {}

# TF1 code: the runner joins the graph's QUEUE_RUNNERS collection and starts with
# tf.compat.v1.train.start_queue_runners and TensorFlow's own Coordinator.
loader = prefetch.Loader(folder, **options)
runner = prefetch.tf.QueueRunner(loader, num_epochs=3, capacity=8)
tf.compat.v1.train.add_queue_runner(runner)
images, labels = runner.dequeue_up_to(5)
features = tf.reshape(tf.cast(images, tf.float32) / 255.0, [-1, 12 * 12 * 3])
weights = tf.compat.v1.get_variable("w", [12 * 12 * 3, 3], initializer=tf.zeros_initializer())
logits = tf.matmul(features, weights)
loss = tf.reduce_mean(
    tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
)
train = tf.compat.v1.train.GradientDescentOptimizer(0.5).minimize(loss)
seen_images, seen_labels, losses = [], [], []
coord = tf.compat.v1.train.Coordinator()
with loader, tf.compat.v1.Session() as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    threads = tf.compat.v1.train.start_queue_runners(sess, coord)
    try:
        while not coord.should_stop():
            _, x, y, value = sess.run([train, images, labels, loss])
            seen_images.append(x)
            seen_labels.append(y)
            losses.append(float(value))
    except tf.errors.OutOfRangeError:
        report["ended_with_out_of_range"] = True
    finally:
        coord.request_stop()
    coord.join(threads, stop_grace_period_secs=10)
    report["threads"] = [t.name for t in threads]
    report["alive_after_join"] = [t.name for t in threads if t.is_alive()]
    report["weights_trained"] = bool(np.abs(sess.run(weights)).sum() > 0)
report["steps"] = len(losses)
report["losses_finite"] = bool(np.isfinite(losses).all())
np.savez(out, images=np.concatenate(seen_images), labels=np.concatenate(seen_labels))

# The prefetch Coordinator and create_threads(sess, coord, start=True), stopped while the
# feeder is blocked on a full queue (num_epochs=None: only a stop ends it).
with tf.Graph().as_default():
    loader = prefetch.Loader(folder, **options)
    runner = prefetch.tf.QueueRunner(loader, capacity=2)
    size = runner.size()
    coord = prefetch.Coordinator()
    with loader, tf.compat.v1.Session() as sess:
        threads = runner.create_threads(sess, coord, start=True)
        while sess.run(size) < 2:
            coord.wait_for_stop(0.01)
        coord.request_stop()
        coord.join(stop_grace_period_secs=10)
        report["blocked_feeder_stopped"] = not any(t.is_alive() for t in threads)
print(json.dumps(report))
"""


# A fresh interpreter imports TensorFlow and trains: 5 s on a quiet 2-core machine, 35 s with
# four busy loops beside it.
@pytest.mark.timeout(120)
def test_tf_compat_v1_session_mode_trains_on_every_sample_once_and_stops_cleanly(
    folder: Path, tmp_path: Path
) -> None:
    script = tmp_path / "v1_session.py"
    script.write_text(textwrap.dedent(V1_SESSION_SCRIPT))
    out = tmp_path / "seen.npz"
    options = dict(OPTIONS, image_size=list(OPTIONS["image_size"]))
    # Generous on purpose (35 s measured with four busy loops, above): only a hang should reach
    # it. It stays below the test's 120 s, so a hang ends here, naming the script's command.
    result = subprocess.run(
        [sys.executable, str(script), str(folder), str(out), json.dumps(options)],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["ended_with_out_of_range"]
    assert len(report["threads"]) == 2 and report["alive_after_join"] == []
    assert report["blocked_feeder_stopped"]
    assert report["steps"] == 13  # 63 samples: 12 batches of 5, then the last 3
    assert report["weights_trained"] and report["losses_finite"]
    seen = np.load(out)
    got = [(x.tobytes(), int(y)) for x, y in zip(seen["images"], seen["labels"], strict=True)]
    assert got == reference_samples(folder, 3)


def test_a_gradient_tape_loop_fed_by_the_queue_learns_well_above_chance(
    tmp_path: Path,
) -> None:
    train = write_image_folder(tmp_path / "train", per_class=60, size=(40, 40), seed=1)
    held_out = write_image_folder(tmp_path / "held_out", per_class=30, size=(40, 40), seed=2)
    keras.utils.set_random_seed(0)
    model = small_cnn(32, 3)
    loader = prefetch.Loader(train, batch_size=30, image_size=(32, 32), workers=2, seed=0)
    runner = prefetch.tf.QueueRunner(loader, num_epochs=8, capacity=90)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step() -> Any:
        images, labels = runner.dequeue_many(30)
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        model.optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    coord = prefetch.Coordinator()
    steps = 0
    with loader:
        runner.create_threads(coord=coord, start=True)
        with coord.stop_on_exception():
            while not coord.should_stop():
                train_step()
                steps += 1
        coord.join()
    assert steps == 8 * 180 // 30
    test = prefetch.Loader(held_out, batch_size=90, image_size=(32, 32), shuffle=False)
    correct = total = 0
    for images, labels in test:
        predicted = np.argmax(model(images, training=False).numpy(), axis=1)
        correct += int((predicted == labels).sum())
        total += len(labels)
    assert total == 90
    assert correct / total > 0.6, f"held-out accuracy {correct / total:.2f} (chance: 0.33)"
