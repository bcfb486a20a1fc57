"""prefetch.tf.resident: device-resident datasets, folds on one upload, macro-batch streams."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import prefetch
from prefetch.testing import FailingDecoder, small_cnn, write_image_folder

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from prefetch.tools.feeding import feeding_benchmark  # noqa: E402  (after the TensorFlow check)

pytestmark = pytest.mark.timeout(60)


class InjectedDecodeError(Exception):
    """A decode error type that only this test module raises."""


def numbered(count: int, size: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """Images that carry their own sample number in two pixels, and labels number % 3."""
    images = np.zeros((count, size, size, 3), np.uint8)
    images[:, 0, 0, 0] = np.arange(count) % 256
    images[:, 0, 0, 1] = np.arange(count) // 256
    return images, (np.arange(count) % 3).astype(np.int32)


def numbers(images: object) -> list[int]:
    """The sample numbers carried by a batch of `numbered` images (a tensor or an array)."""
    array = np.asarray(images)
    return [int(a) + 256 * int(b) for a, b in array[:, 0, 0, :2]]


def epoch_numbers(dataset: object) -> list[list[int]]:
    """One epoch of a resident dataset or stream: the sample numbers of each batch."""
    batches = []
    for images, labels in dataset:  # type: ignore[attr-defined]
        found = numbers(images)
        assert labels.numpy().tolist() == [n % 3 for n in found], "labels left their images"
        batches.append(found)
    return batches


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_image_folder(tmp_path_factory.mktemp("shapes"), per_class=60, size=(40, 40))


# ---- epochs ------------------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", ["batches", "samples", False])
def test_every_sample_comes_exactly_once_per_epoch(shuffle: str | bool) -> None:
    data = prefetch.tf.resident(*numbered(50), batch_size=8, shuffle=shuffle, seed=1)
    assert len(data) == 7
    for _ in range(3):
        batches = epoch_numbers(data)
        assert [len(b) for b in batches].count(8) == 6 and sorted(map(len, batches))[0] == 2
        assert sorted(n for b in batches for n in b) == list(range(50))
    assert data.epoch == 3


def test_the_order_changes_with_the_epoch_and_is_reproducible_from_the_seed() -> None:
    runs = []
    for seed in (7, 7, 8):
        data = prefetch.tf.resident(*numbered(40), batch_size=5, shuffle="samples", seed=seed)
        runs.append([epoch_numbers(data) for _ in range(3)])
    assert runs[0] == runs[1], "the same seed must give the same batches"
    assert runs[0] != runs[2], "another seed should give another order"
    assert runs[0][0] != runs[0][1] != runs[0][2], "each epoch should have a new order"
    data = prefetch.tf.resident(*numbered(40), batch_size=5, shuffle="samples", seed=7)
    assert [b.tolist() for b in data.batch_indices(2)] == runs[0][2]


def test_batches_mode_reorders_fixed_groups_that_are_contiguous_on_the_device() -> None:
    data = prefetch.tf.resident(*numbered(48), batch_size=8, shuffle="batches", seed=2)
    epochs = [epoch_numbers(data) for _ in range(3)]
    groups = [sorted(tuple(sorted(b)) for b in epoch) for epoch in epochs]
    assert groups[0] == groups[1] == groups[2], "the groups stay, only their order changes"
    assert epochs[0] != epochs[1]
    assert groups[0] != sorted(tuple(range(i, i + 8)) for i in range(0, 48, 8)), "not shuffled"
    rows = data.rows
    for batch in data.batch_indices(0):
        assert np.all(np.diff(rows[batch]) == 1), "a batch should be one slice of the upload"
    samples = prefetch.tf.resident(*numbered(48), batch_size=8, shuffle="samples", seed=2)
    regrouped = [sorted(tuple(sorted(b)) for b in epoch_numbers(samples)) for _ in range(2)]
    assert regrouped[0] != regrouped[1]


def test_without_shuffle_batches_come_in_sample_order_and_drop_remainder_drops_the_last() -> None:
    data = prefetch.tf.resident(*numbered(20), batch_size=6, shuffle=False, drop_remainder=True)
    assert epoch_numbers(data) == [list(range(0, 6)), list(range(6, 12)), list(range(12, 18))]


# ---- views on one upload ---------------------------------------------------------------------


def test_folds_are_disjoint_cover_the_data_and_reuse_the_one_upload() -> None:
    data = prefetch.tf.resident(*numbered(31), batch_size=4, seed=3)
    pairs = data.folds(3)
    held_out = []
    for train, validation in pairs:
        assert train.images is data.images and validation.labels is data.labels
        seen_train = sorted(n for b in epoch_numbers(train) for n in b)
        seen_validation = sorted(n for b in epoch_numbers(validation) for n in b)
        assert not set(seen_train) & set(seen_validation)
        assert sorted(seen_train + seen_validation) == list(range(31))
        held_out.append(seen_validation)
    assert sorted(n for fold in held_out for n in fold) == list(range(31))
    assert sorted(len(fold) for fold in held_out) == [10, 10, 11]
    assert data.uploads == 1, "views must gather from the first upload, not copy again"


def test_a_subset_delivers_its_samples_and_a_subset_of_it_numbers_from_it() -> None:
    data = prefetch.tf.resident(*numbered(30), batch_size=4, shuffle="samples", seed=4)
    picked = data.subset([3, 5, 7, 11, 13, 17, 19], shuffle=False, batch_size=3)
    assert epoch_numbers(picked) == [[3, 5, 7], [11, 13, 17], [19]]
    nested = picked.subset([0, 6])
    assert epoch_numbers(nested) == [[3, 19]]
    assert nested.images is data.images and data.uploads == 1


def test_keras_fit_on_a_resident_fold_learns_well_above_chance(shapes: Path) -> None:
    keras.utils.set_random_seed(0)
    loader = prefetch.Loader(shapes, batch_size=30, image_size=(32, 32), shuffle=False, seed=0)
    data = prefetch.tf.resident(loader)
    train, validation = data.folds(3)[0]
    model = small_cnn(32, 3)
    trainer = train.keras_model(model)
    history = trainer.fit(train.index_dataset(), epochs=8, shuffle=False, verbose=0)
    _, accuracy = trainer.evaluate(validation.index_dataset(), verbose=0)
    assert len(history.history["loss"]) == 8 and train.epoch == 8
    assert accuracy > 0.6, f"held-out accuracy {accuracy:.2f} is not clearly above chance (0.33)"
    # The wrapper trained `model` itself: it gives the same accuracy on the same images.
    images, labels = (np.concatenate(parts) for parts in zip(*validation, strict=True))
    _, direct = model.evaluate(images, labels, verbose=0)
    assert direct == pytest.approx(accuracy)
    assert data.uploads == 1


def test_a_loader_is_decoded_once_into_the_upload_in_its_order(shapes: Path) -> None:
    options = dict(batch_size=16, image_size=(16, 16), shuffle=False, workers=2)
    expected = list(prefetch.Loader(shapes, **options))  # type: ignore[arg-type]
    loader = prefetch.Loader(shapes, **options)  # type: ignore[arg-type]
    data = prefetch.tf.resident(loader, shuffle=False)
    assert data.batch_size == 16 and data.seed == loader.options.seed
    got = list(data)
    assert len(got) == len(expected) == math.ceil(180 / 16)
    for (x, y), (ex, ey) in zip(got, expected, strict=True):
        np.testing.assert_array_equal(x.numpy(), ex)
        np.testing.assert_array_equal(y.numpy(), ey)


# ---- memory budget -------------------------------------------------------------------------


def test_the_budget_error_says_which_macro_batches_would_fit(shapes: Path) -> None:
    loader = prefetch.Loader(shapes, batch_size=10, image_size=(16, 16), workers=1)
    sample = 16 * 16 * 3 + 4
    budget = 7 * 10 * sample  # room for 7 batches: two buffers of up to 3
    with pytest.raises(prefetch.tf.DoesNotFitError) as raised:
        prefetch.tf.resident(loader, memory_budget=budget)
    message = str(raised.value)
    assert f"needs 135.7 KiB, budget {budget / 1024:.1f} KiB" in message  # 180 x 772 bytes
    assert "macro_batches=K) with K <= 3" in message and "prefetch.tf.dataset(loader)" in message
    assert isinstance(raised.value, MemoryError) and raised.value.max_macro_batches == 3
    assert loader.stats().images == 0, "the check runs before anything is decoded"
    prefetch.tf.resident_stream(loader, macro_batches=3, memory_budget=budget)  # fits
    with pytest.raises(prefetch.tf.DoesNotFitError, match="K <= 3"):
        prefetch.tf.resident_stream(loader, macro_batches=4, memory_budget=budget)


def test_arrays_over_the_budget_are_refused_and_a_tiny_budget_says_nothing_fits() -> None:
    images, labels = numbered(100)
    with pytest.raises(prefetch.tf.DoesNotFitError, match=r"needs .* budget 1000 B"):
        prefetch.tf.resident(images, labels, batch_size=10, memory_budget=1000)
    with pytest.raises(prefetch.tf.DoesNotFitError, match="not even two batches fit"):
        prefetch.tf.resident(images, labels, batch_size=50, memory_budget=1000)


def test_the_default_budget_is_a_share_of_the_free_memory() -> None:
    budget = prefetch.tf.device_memory_budget("CPU:0")
    assert 0 < budget <= prefetch.tf.device_memory_budget("CPU:0", fraction=1.0) * 1.01


def test_bad_arguments_name_the_argument_and_the_fix() -> None:
    images, labels = numbered(10)
    with pytest.raises(ValueError, match="shuffle must be 'batches', 'samples' or False"):
        prefetch.tf.resident(images, labels, shuffle="random")
    with pytest.raises(ValueError, match="'GPU:7' is not a device TensorFlow sees"):
        prefetch.tf.resident(images, labels, device="GPU:7")
    with pytest.raises(ValueError, match="9 labels for 10 images"):
        prefetch.tf.resident(images, labels[:9])
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
        prefetch.tf.resident(images, labels, batch_size=0)
    data = prefetch.tf.resident(images, labels)
    with pytest.raises(ValueError, match=r"indices must be in \[0, 10\)"):
        data.subset([2, 10])
    with pytest.raises(ValueError, match="k must be in"):
        data.folds(11)


# ---- streaming macro-batches --------------------------------------------------------------


def test_a_stream_delivers_every_sample_once_in_the_loaders_order(shapes: Path) -> None:
    options = dict(batch_size=8, image_size=(16, 16), workers=2, seed=3)
    reference = prefetch.Loader(shapes, **options)  # type: ignore[arg-type]
    expected = [list(reference) for _ in range(2)]
    loader = prefetch.Loader(shapes, **options)  # type: ignore[arg-type]
    stream = prefetch.tf.resident_stream(loader, macro_batches=3, micro_batch_size=5)
    sizes = []
    for epoch in range(2):
        got = list(stream)
        sizes.append([int(x.shape[0]) for x, _ in got])
        np.testing.assert_array_equal(
            np.concatenate([x.numpy() for x, _ in got]),
            np.concatenate([x for x, _ in expected[epoch]]),
        )
        np.testing.assert_array_equal(
            np.concatenate([y.numpy() for _, y in got]),
            np.concatenate([y for _, y in expected[epoch]]),
        )
    # 23 loader batches (22 of 8, one of 4) -> 7 macro-batches of 24 samples and one of 12;
    # micro-batches of 5 do not straddle them: 5, 5, 5, 5, 4 per macro-batch, then 5, 5, 2.
    assert sizes[0] == sizes[1] == [5, 5, 5, 5, 4] * 7 + [5, 5, 2]
    assert len(stream) == len(sizes[0])
    assert stream.uploads == 2 * math.ceil(23 / 3)


def test_the_next_macro_batch_uploads_while_one_is_consumed_and_no_more(shapes: Path) -> None:
    loader = prefetch.Loader(shapes, batch_size=8, image_size=(16, 16), workers=2)
    stream = prefetch.tf.resident_stream(loader, macro_batches=1, micro_batch_size=4)
    deadline = time.monotonic() + 20
    with contextlib.closing(iter(stream)) as epoch:
        next(epoch)  # the consumer holds the first macro-batch
        while stream.uploads < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert stream.uploads == 2, "the second macro-batch should upload in the background"
        time.sleep(0.3)
        assert stream.uploads == 2, "a third would exceed the two buffers"
        next(epoch)
        next(epoch)  # the first macro-batch is done: its buffer goes to the third
        while stream.uploads < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert stream.uploads == 3


def test_leaving_a_stream_epoch_early_stops_its_upload_thread_and_the_loader(
    shapes: Path,
) -> None:
    loader = prefetch.Loader(shapes, batch_size=8, image_size=(16, 16), workers=2)
    stream = prefetch.tf.resident_stream(loader, macro_batches=2)
    epoch = iter(stream)
    next(epoch)
    assert any(t.name == "prefetch-resident-upload" for t in threading.enumerate())
    epoch.close()  # what breaking out of a for loop does
    assert not any(t.name == "prefetch-resident-upload" for t in threading.enumerate())
    assert len(list(stream)) == len(stream), "the next epoch runs whole"


def test_a_loader_error_reaches_the_stream_consumer_as_itself(shapes: Path) -> None:
    decoder = FailingDecoder("square_0007", error=InjectedDecodeError)
    loader = prefetch.Loader(shapes, batch_size=8, image_size=(16, 16), decoder=decoder, seed=0)
    stream = prefetch.tf.resident_stream(loader, macro_batches=2)
    with pytest.raises(InjectedDecodeError) as raised:
        for _ in stream:
            pass
    assert "square_0007" in "\n".join(getattr(raised.value, "__notes__", []))


# ---- feeding strategies -------------------------------------------------------------------


def test_the_feeding_benchmark_times_every_strategy_on_the_same_batches() -> None:
    images, labels = numbered(70)
    rows = feeding_benchmark(
        images, labels, micro_batch_sizes=(16,), macro_batch_sizes=(40,), epochs=1
    )
    assert [(r.strategy, r.micro_batch_size, r.macro_batch_size) for r in rows] == [
        ("input", 16, None),
        ("shared all", 16, None),
        ("shared batched", 16, 32),
    ]
    sample = 6 * 6 * 3 + 4
    assert [r.bytes_per_epoch for r in rows] == [64 * sample, 0, 64 * sample]
    for row in rows:
        assert row.epoch_s > 0 and row.images_per_s == pytest.approx(64 / row.epoch_s)


# ---- GPU -----------------------------------------------------------------------------------


@pytest.mark.gpu
def test_on_a_gpu_the_data_and_the_batches_live_on_gpu_0(shapes: Path) -> None:
    data = prefetch.tf.resident(*numbered(40), batch_size=8, shuffle="samples")
    assert data.device.endswith("GPU:0") and data.images.device.endswith("GPU:0")
    images, labels = next(iter(data))
    assert images.device.endswith("GPU:0") and labels.dtype == tf.int32  # int32 may stay on host
    loader = prefetch.Loader(shapes, batch_size=8, image_size=(16, 16), workers=2)
    images, labels = next(iter(prefetch.tf.resident_stream(loader, macro_batches=2)))
    assert images.device.endswith("GPU:0")


@pytest.mark.gpu
def test_the_gpu_budget_shrinks_by_what_an_upload_takes() -> None:
    before = prefetch.tf.device_memory_budget("GPU:0", fraction=1.0)
    data = prefetch.tf.resident(np.zeros((64, 1024, 1024), np.uint8), device="GPU:0")
    after = prefetch.tf.device_memory_budget("GPU:0", fraction=1.0)
    assert tf.config.experimental.get_memory_info("GPU:0")["current"] >= 64 * 2**20
    assert before - after >= 64 * 2**20
    del data
