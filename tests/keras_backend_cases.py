"""prefetch.keras.dataset under one Keras backend: run by test_keras_backends.py in a subprocess
with KERAS_BACKEND set (Keras fixes its backend when imported), as
`KERAS_BACKEND=torch python -m pytest tests/keras_backend_cases.py`. Not collected on its own.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_rank_epochs import OPTIONS as RANK_OPTIONS
from test_rank_epochs import check_resumed_ranks, folder, ids  # noqa: F401 (a fixture)

import prefetch
from prefetch.testing import FailingDecoder, small_cnn, write_image_folder

keras = pytest.importorskip("keras")
BACKEND = keras.backend.backend()
OPTIONS: dict[str, Any] = dict(batch_size=20, image_size=(32, 32), workers=2, seed=0)


class InjectedDecodeError(Exception):
    """A decode error type that only this module raises."""


class StopAfter(keras.callbacks.Callback):  # type: ignore[misc]
    """Stops training after `batches` batches of epoch `epoch` (mid-epoch)."""

    def __init__(self, epoch: int, batches: int) -> None:
        super().__init__()
        self.stop_at, self.batches, self.epoch = epoch, batches, 0

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.epoch = epoch

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self.epoch == self.stop_at and batch + 1 == self.batches:
            self.model.stop_training = True


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("shapes")
    train = write_image_folder(root / "train", per_class=40, size=(40, 40), seed=1)
    held_out = write_image_folder(root / "held_out", per_class=14, size=(40, 40), seed=2)
    return train, held_out


def fit_quietly(model: Any, *args: Any, **kwargs: Any) -> Any:
    """model.fit with every warning an error (Keras warns on a dataset that runs dry)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        return model.fit(*args, verbose=0, **kwargs)


def test_fit_evaluate_and_predict_import_no_other_framework(shapes: tuple[Path, Path]) -> None:
    # First in this file: keras.utils.set_random_seed, used below, imports TensorFlow itself.
    train, _ = shapes
    model = small_cnn(32, 3)
    with prefetch.Loader(train, **OPTIONS) as loader:
        ds = prefetch.keras.dataset(loader)
        fit_quietly(model, ds, epochs=1)
        model.evaluate(ds, verbose=0)
        model.predict(ds, verbose=0)
    if BACKEND != "tensorflow":
        assert "tensorflow" not in sys.modules


def test_fit_with_validation_evaluate_and_predict_learn_and_read_every_epoch(
    shapes: tuple[Path, Path],
) -> None:
    train, held_out = shapes
    keras.utils.set_random_seed(0)
    model = small_cnn(32, 3)
    loader = prefetch.Loader(train, **OPTIONS)
    test = prefetch.Loader(held_out, **{**OPTIONS, "shuffle": False})
    with loader, test:
        ds, val = prefetch.keras.dataset(loader), prefetch.keras.dataset(test)
        assert ds.class_names == ["circle", "square", "triangle"]
        assert len(ds.file_paths) == 120
        history = fit_quietly(model, ds, validation_data=val, epochs=6)
        _, accuracy = model.evaluate(val, verbose=0)
        predictions = model.predict(val, verbose=0)
    assert len(history.history["val_loss"]) == 6
    assert loader.stats().epochs == 6 and loader.stats().images == 6 * 120
    assert test.stats().epochs == 6 + 2  # a validation per epoch, evaluate, predict
    assert predictions.shape == (42, 3)
    assert accuracy > 0.6, f"held-out accuracy {accuracy:.2f} is not clearly above chance"


def test_a_short_steps_per_epoch_continues_the_loaders_epoch(shapes: tuple[Path, Path]) -> None:
    train, _ = shapes
    model = small_cnn(32, 3)
    with prefetch.Loader(train, **OPTIONS) as loader:
        # Keras warns unless steps_per_epoch divides the dataset's 6 batches, for any dataset.
        history = fit_quietly(model, prefetch.keras.dataset(loader), epochs=3, steps_per_epoch=3)
    assert len(history.history["loss"]) == 3
    assert loader.stats().batches >= 9  # the first epoch of 6 batches, then half the next
    if BACKEND != "tensorflow":  # TensorFlow's prefetch reads ahead of the steps
        assert loader.state_dict().items() >= {"seed": 0, "epoch": 1, "position": 3}.items()


def test_a_callback_stopping_mid_epoch_ends_fit_and_the_next_fit_runs_a_fresh_epoch(
    shapes: tuple[Path, Path],
) -> None:
    train, _ = shapes
    model = small_cnn(32, 3)
    with prefetch.Loader(train, **OPTIONS) as loader:
        ds = prefetch.keras.dataset(loader)
        history = fit_quietly(model, ds, epochs=5, callbacks=[StopAfter(epoch=1, batches=2)])
        assert len(history.history["loss"]) == 2
        if BACKEND != "tensorflow":
            assert loader.state_dict().items() >= {"seed": 0, "epoch": 1, "position": 2}.items()
        history = fit_quietly(model, ds, epochs=2)
    assert len(history.history["loss"]) == 2
    assert loader.state_dict().items() >= {"seed": 0, "epoch": 4, "position": 0}.items()


def test_a_worker_error_in_fit_reaches_the_user_with_its_original_type(
    shapes: tuple[Path, Path],
) -> None:
    train, _ = shapes
    decoder = FailingDecoder("square_0007", error=InjectedDecodeError)
    loader = prefetch.Loader(train, **{**OPTIONS, "decoder": decoder, "backend": "thread"})
    model = small_cnn(32, 3)
    with pytest.raises(InjectedDecodeError, match="injected failure") as raised, loader:
        # A callback with on_train_batch_end keeps Keras's callbacks synchronous: its thread
        # pool for asynchronous ones is never shut down when fit raises (a Keras leak).
        callbacks = [StopAfter(epoch=-1, batches=0)]
        model.fit(prefetch.keras.dataset(loader), epochs=1, verbose=0, callbacks=callbacks)
    assert "square_0007" in "\n".join(getattr(raised.value, "__notes__", []))


def test_a_resumed_loader_gives_the_rest_of_its_epoch_then_whole_epochs(
    shapes: tuple[Path, Path],
) -> None:
    train, _ = shapes
    reference = prefetch.Loader(train, **OPTIONS)
    expected = [labels.copy() for _ in range(2) for _, labels in reference]
    first = prefetch.Loader(train, **OPTIONS)
    stream = iter(first)
    seen = [next(stream).labels.copy() for _ in range(2)]
    state = first.state_dict()
    stream.close()
    resumed = prefetch.Loader(train, **OPTIONS)
    resumed.load_state_dict(state)
    ds = prefetch.keras.dataset(resumed)
    got = []
    with resumed:
        for steps in (len(resumed) - state["position"], len(resumed)):  # as Keras calls it
            ds.on_epoch_begin()
            got += [ds[index][1].copy() for index in np.random.permutation(steps)]
            ds.on_epoch_end()
    assert len(seen + got) == len(expected)
    assert all(np.array_equal(a, b) for a, b in zip(seen + got, expected, strict=True))


def test_fit_finishes_a_resumed_epoch_then_runs_whole_ones_without_a_warning(
    shapes: tuple[Path, Path],
) -> None:
    train, _ = shapes
    resumed = prefetch.Loader(train, **OPTIONS)
    resumed.load_state_dict({"seed": 0, "epoch": 3, "position": 2})
    model = small_cnn(32, 3)
    with resumed:
        ds = prefetch.keras.dataset(resumed)
        steps_left = len(resumed) - 2
        fit_quietly(model, ds, epochs=4, initial_epoch=3, steps_per_epoch=steps_left)
        history = fit_quietly(model, ds, epochs=6, initial_epoch=4)
    assert len(history.history["loss"]) == 2
    assert resumed.stats().epochs == 3
    if BACKEND != "tensorflow":  # TensorFlow's prefetch reads ahead of a short epoch's steps
        assert resumed.stats().batches == steps_left + 2 * len(resumed)


class Preempted(Exception):
    """What a preemption handler raises to leave `fit`."""


class LeaveAfter(keras.callbacks.Callback):  # type: ignore[misc]
    """Leaves `fit` after `batches` steps: stops training, or raises `Preempted` (with
    `batches=0`, as the first epoch begins: after Keras took a batch to build the model)."""

    def __init__(self, batches: int, raising: bool) -> None:
        super().__init__()
        self.batches, self.raising = batches, raising

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        if self.batches == 0:
            raise Preempted

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if batch + 1 == self.batches:
            if self.raising:
                raise Preempted
            self.model.stop_training = True


@pytest.mark.parametrize("taken, raising", [(3, False), (3, True), (0, True)])
def test_a_state_taken_after_fit_was_left_resumes_on_other_ranks_reading_each_sample_once(
    folder: Path,  # noqa: F811 (the fixture)
    taken: int,
    raising: bool,
) -> None:
    # 2 ranks of batch 3 leave fit after `taken` steps; 3 ranks of batch 2 resume their state.
    states, epoch_read, looked = [], [], []
    for rank in range(2):
        loader = prefetch.Loader(ids(folder), batch_size=3, **RANK_OPTIONS)  # type: ignore[arg-type]
        loader.shard(2, rank)
        model = small_cnn(8, 37)
        with loader:
            ds = prefetch.keras.dataset(loader, distributed=False)
            with pytest.raises(Preempted) if raising else contextlib.nullcontext():
                model.fit(ds, epochs=2, verbose=0, callbacks=[LeaveAfter(taken, raising)])
            gc.collect()  # Keras's iterator, kept by the error's traceback, stops reading
            states.append(ds.state_dict())
            looked.append(loader.state_dict()["position"])
        epoch_read += [b.tolist() for b in loader.batch_indices(0)[: states[-1]["position"]]]
    assert [state["epoch"] for state in states] == [0, 0]
    if BACKEND == "tensorflow":
        # Keras's own prefetch buffer reads ahead of its steps, each rank as far as it got;
        # what it took counts as handed (prefetch.keras.dataset's docstring).
        assert all(state["position"] >= taken for state in states)
        return
    assert states == [states[0]] * 2 and states[0]["position"] == taken
    if taken == 0:  # Keras took batch 0 to build the model; it is handed out again, not lost
        assert looked == [1, 1]
    check_resumed_ranks(ids(folder), states[0], 3, 2, True, epoch_read)


def test_after_a_whole_epoch_of_fit_the_state_names_the_next_epoch_on_every_backend(
    folder: Path,  # noqa: F811 (the fixture)
) -> None:
    # The way to take an exact state under the TensorFlow backend too: Keras's prefetch buffer
    # cannot read past the epoch's last batch (docs/training-loops.md).
    loader = prefetch.Loader(ids(folder), batch_size=3, **RANK_OPTIONS)  # type: ignore[arg-type]
    loader.shard(2, 1)
    with loader:
        ds = prefetch.keras.dataset(loader, distributed=False)
        fit_quietly(small_cnn(8, 37), ds, epochs=1)
        state = ds.state_dict()
    assert state == {**state, "epoch": 1, "position": 0, "samples": 0}
