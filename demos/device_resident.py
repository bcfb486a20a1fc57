"""The whole dataset on the device: minibatches sliced there, against feeding from the host.

    python demos/device_resident.py              # generates a small folder of shapes first
    python demos/device_resident.py --per-class 400 --image-size 64 --device GPU:0

It decodes the folder once, uploads it with prefetch.tf.resident, and trains the same small
CNN with Keras fit three ways, printing epoch time and images/s for each:
  - host, decoding: prefetch.tf.dataset(loader) decodes and feeds every batch each epoch
  - host, numpy:    the decoded arrays, batched by tf.data on the host and copied each step
  - resident:       one upload; each step receives only batch indices and gathers on the device
Then it runs k-fold cross-validation on the same upload and reports each fold's accuracy.
On the CPU device, host and device memory are the same RAM, so expect the three to be close;
the resident way gains where every host batch has to cross PCIe to a GPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import prefetch
from prefetch.testing import small_cnn, write_image_folder

CLASSES = ("circle", "square", "triangle", "cross")


def epoch_timer() -> tuple[Any, list[float]]:
    """A Keras callback that records the wall time of each epoch."""
    import keras

    times: list[float] = []
    began = [0.0]
    callback = keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda epoch, logs: began.__setitem__(0, time.perf_counter()),
        on_epoch_end=lambda epoch, logs: times.append(time.perf_counter() - began[0]),
    )
    return callback, times


def fit_and_time(model: Any, data: Any, epochs: int) -> float:
    """Median epoch time of `model.fit(data)`, leaving out the first epoch (tracing)."""
    callback, times = epoch_timer()
    model.fit(data, epochs=epochs, shuffle=False, verbose=0, callbacks=[callback])
    return statistics.median(times[1:] if len(times) > 1 else times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-class", type=int, default=150, help="generated images per class")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=4, help="epochs per feeding way")
    parser.add_argument("--folds", type=int, default=3)
    parser.add_argument("--fold-epochs", type=int, default=4)
    parser.add_argument("--device", default=None, help="default: GPU:0 if there is one")
    args = parser.parse_args()

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    size = (args.image_size, args.image_size)
    with tempfile.TemporaryDirectory() as tmp:
        count = args.per_class * len(CLASSES)
        print(f"generating {count} JPEGs of shapes ...")
        root = write_image_folder(
            Path(tmp), class_names=CLASSES, per_class=args.per_class, size=(64, 64), seed=0
        )
        loader = prefetch.Loader(root, batch_size=args.batch_size, image_size=size, seed=0)
        in_order = prefetch.Loader(root, batch_size=256, image_size=size, shuffle=False)

        began = time.perf_counter()
        data = prefetch.tf.resident(in_order, batch_size=args.batch_size, device=args.device)
        upload_s = time.perf_counter() - began
        budget = prefetch.tf.device_memory_budget(data.device)
        nbytes = data.num_samples * int(np.prod(data.images.shape[1:]))
        print(
            f"decoded and uploaded {data.num_samples} images ({nbytes / 2**20:.1f} MiB) to "
            f"{data.device} in {upload_s:.2f} s; budget left {budget / 2**30:.1f} GiB"
        )
        host_images = np.concatenate([x.numpy() for x, _ in data])
        host_labels = np.concatenate([y.numpy() for _, y in data])

        rows = []
        keras.utils.set_random_seed(0)
        with loader:
            seconds = fit_and_time(
                small_cnn(args.image_size, len(CLASSES)), prefetch.tf.dataset(loader), args.epochs
            )
        rows.append(("host, decoding: prefetch.tf.dataset(loader)", seconds))

        keras.utils.set_random_seed(0)
        numpy_batches = (
            tf.data.Dataset.from_tensor_slices((host_images, host_labels))
            .shuffle(len(host_images), seed=0)
            .batch(args.batch_size)
            .prefetch(1)
        )
        seconds = fit_and_time(small_cnn(args.image_size, len(CLASSES)), numpy_batches, args.epochs)
        rows.append(("host, numpy: tf.data from arrays", seconds))

        keras.utils.set_random_seed(0)
        trainer = data.keras_model(small_cnn(args.image_size, len(CLASSES)))
        seconds = fit_and_time(trainer, data.index_dataset(), args.epochs)
        rows.append(("resident: keras_model + index_dataset", seconds))

        print(
            f"\nKeras fit, {count} images {size[0]}x{size[1]}, batch {args.batch_size}, "
            f"median of epochs 2..{args.epochs} (machine load makes these noisy)"
        )
        print(f"{'feeding':46s} {'epoch s':>8s} {'images/s':>9s} {'vs decoding':>12s}")
        for name, seconds in rows:
            print(f"{name:46s} {seconds:8.2f} {count / seconds:9.0f} {rows[0][1] / seconds:11.2f}x")

        print(f"\n{args.folds}-fold cross-validation on the same upload:")
        accuracies = []
        for fold, (train, validation) in enumerate(data.folds(args.folds)):
            keras.utils.set_random_seed(fold)
            model = small_cnn(args.image_size, len(CLASSES))
            trainer = train.keras_model(model)
            trainer.fit(train.index_dataset(), epochs=args.fold_epochs, shuffle=False, verbose=0)
            _, accuracy = trainer.evaluate(validation.index_dataset(), verbose=0)
            accuracies.append(accuracy)
            print(
                f"fold {fold + 1}: trained on {train.num_samples}, validated on "
                f"{validation.num_samples}: accuracy {accuracy:.1%}"
            )
        print(
            f"mean accuracy {np.mean(accuracies):.1%} (chance {1 / len(CLASSES):.0%}); "
            f"the data were uploaded {data.uploads} time(s) for all {args.folds} folds"
        )


if __name__ == "__main__":
    main()
