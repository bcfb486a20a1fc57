"""prefetch.tf.dataset: batches into tf.data and Keras fit, devices, errors, slot lifetime."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import prefetch
from prefetch.testing import FailingDecoder, small_cnn, write_image_folder

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")


class InjectedDecodeError(Exception):
    """A decode error type that only this test module raises."""


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A training and a held-out folder of learnable shapes (different random draws)."""
    root = tmp_path_factory.mktemp("shapes")
    train = write_image_folder(root / "train", per_class=60, size=(40, 40), seed=1)
    held_out = write_image_folder(root / "held_out", per_class=30, size=(40, 40), seed=2)
    return train, held_out


def test_keras_fit_on_a_generated_folder_learns_well_above_chance(
    shapes: tuple[Path, Path],
) -> None:
    train, held_out = shapes
    keras.utils.set_random_seed(0)
    model = small_cnn(32, 3)
    loader = prefetch.Loader(train, batch_size=30, image_size=(32, 32), workers=2, seed=0)
    test = prefetch.Loader(held_out, batch_size=30, image_size=(32, 32), workers=2, shuffle=False)
    with loader, test:
        history = model.fit(prefetch.tf.dataset(loader), epochs=8, shuffle=False, verbose=0)
        _, accuracy = model.evaluate(prefetch.tf.dataset(test), verbose=0)
    assert len(history.history["loss"]) == 8
    assert loader.stats().epochs == 8
    assert loader.stats().images == 8 * 180
    assert accuracy > 0.6, f"held-out accuracy {accuracy:.2f} is not clearly above chance (0.33)"


def test_each_iteration_of_the_dataset_is_the_next_epoch_of_the_loader(
    shapes: tuple[Path, Path],
) -> None:
    train, _ = shapes
    options = dict(batch_size=16, image_size=(24, 24), workers=2, seed=3)
    reference = prefetch.Loader(train, **options)  # type: ignore[arg-type]
    expected = [[(x.copy(), y.copy()) for x, y in reference] for _ in range(2)]
    with prefetch.Loader(train, **options) as loader:  # type: ignore[arg-type]
        ds = prefetch.tf.dataset(loader)
        for epoch in range(2):
            got = [(x.numpy(), y.numpy()) for x, y in ds]
            assert len(got) == len(expected[epoch])
            for (x, y), (ex, ey) in zip(got, expected[epoch], strict=True):
                np.testing.assert_array_equal(x, ex)
                np.testing.assert_array_equal(y, ey)


def test_the_output_signature_is_static_and_matches_the_label_mode(
    shapes: tuple[Path, Path],
) -> None:
    train, _ = shapes
    fixed = prefetch.Loader(train, batch_size=8, image_size=(20, 30), drop_remainder=True)
    images, labels = prefetch.tf.dataset(fixed).element_spec
    assert images.shape.as_list() == [8, 20, 30, 3] and images.dtype == tf.uint8
    assert labels.shape.as_list() == [8] and labels.dtype == tf.int32
    onehot = prefetch.Loader(train, batch_size=8, image_size=(20, 20), label_mode="categorical")
    assert prefetch.tf.dataset(onehot).element_spec[1].shape.as_list() == [None, 3]
    unlabelled = prefetch.Loader(train, batch_size=8, image_size=(20, 20), label_mode=None)
    assert prefetch.tf.dataset(unlabelled).element_spec.shape.as_list() == [None, 20, 20, 3]
    assert prefetch.tf.dataset(fixed).cardinality().numpy() == len(fixed)


@pytest.mark.parametrize(
    "backend, device",
    [("thread", None), ("process", None), ("thread", "/cpu:0"), ("process", "/cpu:0")],
)
def test_tensors_kept_from_the_dataset_are_never_overwritten_by_later_batches(
    shapes: tuple[Path, Path], backend: str, device: str | None
) -> None:
    train, _ = shapes
    options = dict(batch_size=10, image_size=(24, 24), workers=2, depth=1, seed=5)
    expected = list(prefetch.Loader(train, **options))  # type: ignore[arg-type]
    with prefetch.Loader(train, backend=backend, **options) as loader:  # type: ignore[arg-type]
        kept = list(prefetch.tf.dataset(loader, device=device))  # every tensor stays alive
    assert len(kept) == len(expected) == 18
    for (x, y), (ex, ey) in zip(kept, expected, strict=True):
        np.testing.assert_array_equal(x.numpy(), ex)
        np.testing.assert_array_equal(y.numpy(), ey)


@pytest.mark.gpu
def test_batches_prefetched_to_a_gpu_are_on_the_gpu_and_never_overwritten(
    shapes: tuple[Path, Path],
) -> None:
    train, _ = shapes
    options = dict(batch_size=10, image_size=(24, 24), workers=2, depth=1, seed=5)
    expected = list(prefetch.Loader(train, **options))  # type: ignore[arg-type]
    with prefetch.Loader(train, **options) as loader:  # type: ignore[arg-type]
        kept = list(prefetch.tf.dataset(loader, device="/gpu:0"))
    assert len(kept) == len(expected) == 18
    for (x, y), (ex, ey) in zip(kept, expected, strict=True):
        assert x.device.endswith("GPU:0") and y.device.endswith("GPU:0"), (x.device, y.device)
        np.testing.assert_array_equal(x.numpy(), ex)
        np.testing.assert_array_equal(y.numpy(), ey)


@pytest.mark.gpu
def test_keras_fit_runs_epochs_from_a_dataset_prefetched_to_the_gpu(
    shapes: tuple[Path, Path],
) -> None:
    train, _ = shapes
    model = small_cnn(32, 3)
    loader = prefetch.Loader(train, batch_size=30, image_size=(32, 32), workers=2, seed=0)
    with loader:
        ds = prefetch.tf.dataset(loader, device="/gpu:0")
        history = model.fit(ds, epochs=2, shuffle=False, verbose=0)
    assert len(history.history["loss"]) == 2
    assert loader.stats().epochs == 2
    assert np.isfinite(history.history["loss"]).all()


# With a device the length is unknown to tf.data: Keras warns once that the input "ran out of
# data" as it learns it (docs/tensorflow.md); expected here.
@pytest.mark.filterwarnings("ignore:Your input ran out of data")
def test_a_cpu_device_is_accepted_and_keras_fit_runs_every_epoch(
    shapes: tuple[Path, Path],
) -> None:
    train, _ = shapes
    model = small_cnn(16, 3)
    loader = prefetch.Loader(train, batch_size=30, image_size=(16, 16), workers=2, seed=0)
    ds = prefetch.tf.dataset(loader, device="/cpu:0")
    # The copy to the device hides the length from tf.data; Keras learns it in epoch 1.
    assert ds.cardinality().numpy() == tf.data.UNKNOWN_CARDINALITY
    with loader:
        images, _ = next(iter(ds))
        assert images.device.endswith("CPU:0")
        history = model.fit(ds, epochs=3, shuffle=False, verbose=0)
    losses = history.history["loss"]
    assert len(losses) == 3 and all(loss > 0 for loss in losses)  # no epoch without steps
    assert loader.stats().epochs == 3


@pytest.mark.parametrize(
    "device, message",
    [
        ("/gpu:99", "not a device TensorFlow sees in this process"),
        ("cpu zero", "not a TensorFlow device name"),
        ("/job:localhost", "names no device type"),
    ],
)
def test_a_device_tensorflow_does_not_know_is_refused_naming_it(
    shapes: tuple[Path, Path], device: str, message: str
) -> None:
    loader = prefetch.Loader(shapes[0], batch_size=8, image_size=(16, 16))
    with pytest.raises(ValueError, match=message) as raised:
        prefetch.tf.dataset(loader, device=device)
    assert repr(device) in str(raised.value)


def test_device_and_input_context_together_are_refused(shapes: tuple[Path, Path]) -> None:
    loader = prefetch.Loader(shapes[0], batch_size=8, image_size=(16, 16), seed=0)
    context = tf.distribute.InputContext(1, 0, 1)
    with pytest.raises(ValueError, match=r"not both.*leave device=None"):
        prefetch.tf.dataset(loader, device="/cpu:0", input_context=context)


# A process worker must be able to unpickle the error type, so it is a built-in one there.
ERROR_CASES = [("thread", InjectedDecodeError), ("process", LookupError)]


@pytest.mark.parametrize("backend, error", ERROR_CASES)
def test_a_worker_error_in_fit_is_re_raised_as_the_original_when_the_loader_block_exits(
    shapes: tuple[Path, Path], backend: str, error: type[Exception]
) -> None:
    train, _ = shapes
    decoder = FailingDecoder("square_0007", error=error)
    loader = prefetch.Loader(
        train, batch_size=30, image_size=(32, 32), decoder=decoder, seed=0, backend=backend
    )
    model = small_cnn(32, 3)
    with pytest.raises(error, match="injected failure") as raised, loader:
        model.fit(prefetch.tf.dataset(loader), epochs=1, shuffle=False, verbose=0)
    notes = "\n".join(getattr(raised.value, "__notes__", []))
    assert "square_0007" in notes
    # TensorFlow's own error is kept in the chain, so nothing is hidden.
    assert isinstance(raised.value.__context__, tf.errors.OpError)


@pytest.mark.parametrize(
    "backend, error, device",
    [(*ERROR_CASES[0], None), (*ERROR_CASES[1], None), (*ERROR_CASES[0], "/cpu:0")],
)
def test_a_worker_error_in_plain_iteration_is_re_raised_as_the_original(
    shapes: tuple[Path, Path], backend: str, error: type[Exception], device: str | None
) -> None:
    train, _ = shapes
    decoder = FailingDecoder("circle_0003", error=error)
    loader = prefetch.Loader(
        train, batch_size=30, image_size=(32, 32), decoder=decoder, backend=backend
    )
    with pytest.raises(error, match="circle_0003") as raised, loader:
        for _ in prefetch.tf.dataset(loader, device=device):
            pass
    assert isinstance(raised.value.__context__, tf.errors.OpError)


def test_importing_prefetch_does_not_import_tensorflow() -> None:
    code = "import sys, prefetch; print('tensorflow' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_restoring_malloc_thresholds_applies_on_glibc() -> None:
    import platform

    applied = prefetch.tf.restore_malloc_thresholds()
    assert applied == (platform.libc_ver()[0] == "glibc")


def test_public_functions_do_not_shadow_the_modules_they_live_in() -> None:
    import importlib
    import types

    import prefetch.tf

    assert callable(prefetch.tf.dataset) and not isinstance(prefetch.tf.dataset, types.ModuleType)
    assert callable(prefetch.tf.resident) and not isinstance(prefetch.tf.resident, types.ModuleType)
    module = importlib.import_module("prefetch.tf._dataset")
    assert module.restore_malloc_thresholds is prefetch.tf.restore_malloc_thresholds
    assert module.dataset is prefetch.tf.dataset
    for name in prefetch.tf.__all__:
        assert getattr(prefetch.tf, name) is not None, name
        assert not isinstance(getattr(prefetch.tf, name), types.ModuleType), name


def test_patching_a_submodule_name_reaches_the_dataset(shapes: tuple[Path, Path]) -> None:
    from unittest import mock

    train, _ = shapes
    loader = prefetch.Loader(train, batch_size=30, image_size=(32, 32))
    with mock.patch("prefetch.tf._dataset.restore_malloc_thresholds") as patched, loader:
        for _ in prefetch.tf.dataset(loader).take(1):
            pass
    assert patched.call_count == 1


# ---- class_names and file_paths, as Keras's datasets have them (issue 19, item 7) ----------


class Noise:
    """A source of its own: random 12x10 images with labels 0 to 2, and class names."""

    class_names = ("a", "b", "c")

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        image = np.random.default_rng(index).integers(0, 256, (10, 12, 3), dtype=np.uint8)
        return image, index % 3


def test_the_dataset_has_kerass_class_names_and_file_paths(shapes: tuple[Path, Path]) -> None:
    _, held_out = shapes
    expected = keras.utils.image_dataset_from_directory(
        held_out, image_size=(8, 8), shuffle=False, verbose=False
    )
    loader = prefetch.Loader(held_out, batch_size=16, image_size=8, workers=2, shuffle=False)
    ds = prefetch.tf.dataset(loader)
    assert ds.class_names == expected.class_names == ["circle", "square", "triangle"]
    assert ds.file_paths == expected.file_paths
    # Unshuffled, the batches take the files in this order.
    labels = np.concatenate([y.numpy() for _, y in ds])
    folders = [Path(path).parent.name for path in ds.file_paths]
    assert [ds.class_names[label] for label in labels] == folders


def test_a_shuffling_loaders_batch_indices_index_its_file_paths(shapes: tuple[Path, Path]) -> None:
    _, held_out = shapes
    loader = prefetch.Loader(held_out, batch_size=16, image_size=8, workers=2, seed=3)
    ds = prefetch.tf.dataset(loader)
    batches = loader.batch_indices(loader.epoch)
    got = [y.numpy() for _, y in ds]
    assert len(got) == len(batches)
    for labels, indices in zip(got, batches, strict=True):
        folders = [Path(ds.file_paths[index]).parent.name for index in indices]
        assert [ds.class_names[label] for label in labels] == folders


def test_a_source_without_files_has_its_class_names_and_no_file_paths() -> None:
    ds = prefetch.tf.dataset(prefetch.Loader(Noise(), batch_size=3, image_size=8, workers=1))
    assert ds.class_names == ["a", "b", "c"]
    assert ds.file_paths is None
    plain = prefetch.tf.dataset(
        prefetch.Loader(prefetch.FileList(["x.jpg"]), image_size=8, label_mode=None)
    )
    assert plain.class_names is None and plain.file_paths == ["x.jpg"]
