"""Train a small Keras CNN from an image folder fed by prefetch (the main demo).

    python demos/train_keras.py                 # generates a sample folder of shapes first
    python demos/train_keras.py data/train      # any root/<class>/<image> folder

It prints, per epoch, the images/s the loader delivered and the fraction of step time that
training spent waiting for data, then the validation accuracy reached.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import numpy as np

import prefetch
from prefetch.testing import small_cnn, write_image_folder

SAMPLE_CLASSES = ("circle", "square", "triangle", "cross")
# Above this share of step time spent waiting for data, the demo says what to try next.
INPUT_BOUND_WAIT = 0.2


def import_keras_quietly() -> ModuleType:
    """Import Keras and start TensorFlow's devices with TensorFlow's C++ start-up log (absl
    lines, a CUDA `cuInit` error on machines without a GPU) kept out of the output; the log is
    printed only if the import fails."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    saved = os.dup(2)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 2)  # the C++ side writes to file descriptor 2, not sys.stderr
        try:
            import keras
            import tensorflow as tf

            tf.config.list_physical_devices()  # device discovery logs now, not during fit
        except BaseException:
            os.dup2(saved, 2)
            log.seek(0)
            sys.stderr.write(log.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    return keras


def sample_folders(where: Path, per_class: int) -> tuple[Path, Path]:
    """Generate (once) a training and a validation folder of learnable synthetic shapes."""
    train, validation = where / "train", where / "validation"
    for folder, count, seed in ((train, per_class, 0), (validation, per_class // 4, 1)):
        if not folder.is_dir():
            print(f"generating {count * len(SAMPLE_CLASSES)} JPEGs in {folder} ...")
            write_image_folder(
                folder, class_names=SAMPLE_CLASSES, per_class=count, size=(96, 96), seed=seed
            )
    return train, validation


def split(folder: prefetch.ImageFolder, fraction: float) -> tuple[prefetch.FileList, ...]:
    """A seeded train/validation split of one folder."""
    order = np.random.default_rng(1337).permutation(len(folder))
    cut = int(len(folder) * (1 - fraction))
    return folder.subset(order[:cut]), folder.subset(order[cut:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", help="image folder (default: generate a sample)")
    parser.add_argument(
        "--sample-dir", default="sample-data", help="where samples are made (default sample-data)"
    )
    parser.add_argument(
        "--per-class", type=int, default=400, help="sample images per class (default 400)"
    )
    parser.add_argument("--epochs", type=int, default=5, help="training epochs (default 5)")
    parser.add_argument("--batch-size", type=int, default=32, help="images per batch (default 32)")
    parser.add_argument(
        "--image-size", type=int, default=64, help="side of the square input, pixels (default 64)"
    )
    parser.add_argument(
        "--workers", type=int, default=None, help="loader workers (default: usable cores)"
    )
    args = parser.parse_args()

    if args.root:
        train_source, validation_source = split(prefetch.ImageFolder(args.root), 0.2)
    else:
        train_dir, validation_dir = sample_folders(Path(args.sample_dir), args.per_class)
        train_source = prefetch.ImageFolder(train_dir)
        validation_source = prefetch.ImageFolder(validation_dir)
    classes = train_source.class_names
    print(
        f"{len(train_source)} training and {len(validation_source)} validation images, "
        f"classes {classes}; chance accuracy {1 / len(classes):.0%}"
    )

    keras = import_keras_quietly()

    keras.utils.set_random_seed(0)
    size = (args.image_size, args.image_size)
    options = dict(batch_size=args.batch_size, image_size=size, workers=args.workers)
    train = prefetch.Loader(train_source, shuffle=True, seed=0, **options)
    validation = prefetch.Loader(validation_source, shuffle=False, **options)
    model = small_cnn(args.image_size, len(classes))
    input_stats = prefetch.tf.InputStatsCallback(train)
    report = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: print(
            f"epoch {epoch + 1}: {logs['images_per_s']:.0f} images/s, "
            f"waiting for data {logs['input_wait_fraction']:.1%} of step time, "
            f"accuracy {logs['accuracy']:.3f}, validation accuracy {logs['val_accuracy']:.3f}"
        )
    )
    started = time.perf_counter()
    with train, validation:
        history = model.fit(
            prefetch.tf.dataset(train),
            validation_data=prefetch.tf.dataset(validation),
            epochs=args.epochs,
            shuffle=False,  # the loader shuffles
            callbacks=[input_stats, report],
            verbose=0,
        )
    seconds = time.perf_counter() - started
    stats = train.stats()
    accuracy = history.history["val_accuracy"][-1]
    epochs = f"{args.epochs} epoch" + ("s" if args.epochs != 1 else "")
    print(f"\ntrained {epochs} in {seconds:.1f} s")
    print(f"loader: {stats}")
    print(f"validation accuracy: {accuracy:.3f} (chance {1 / len(classes):.3f})")
    if stats.consumer_wait_fraction > INPUT_BOUND_WAIT:
        folder = args.root or str(Path(args.sample_dir) / "train")
        print(f"training was input-bound: try {input_bound_advice(folder, stats.backend)}")


def input_bound_advice(folder: str, backend: str) -> str:
    """What to try when training waited for data: processes only where threads ran."""
    advice = f"`prefetch bench {folder}` (this machine's decode limit and other loaders)"
    if backend == "thread":
        return f'{advice}, more --workers, or processes (backend="process")'
    return f"{advice} or more --workers"


if __name__ == "__main__":
    main()
