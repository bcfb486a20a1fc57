"""Every ```python block of README.md and docs/*.md runs as written (issue 45, item 10).

Each example runs in a subprocess of its own, in a fresh folder whose `data/...` paths lead to
one sample folder of real JPEGs per module (tests/doc_blocks.py), and its printed output is
checked where the page shows it: each string of `shows` is in the page's code (a `# prints`
comment, a sample output) and in what the program printed. A program passes when it exits 0
with no traceback and no `TooManyWorkersWarning` (an example never warns on CI's 2 cores).

What the suite changes, each listed with its example and checked to apply:

- `prelude`: the names the page says the reader brings (a model, an optimizer, a step
  function, the imports of an example that continues another), defined before the code;
- `replace`: fewer epochs (`epochs=10` -> `epochs=1`, the `EPOCHS, SIZE = ...` line), nothing
  else that changes what the example shows;
- everywhere: absolute paths made relative to the run's folder and bucket or web URLs
  pointed at a loopback server of the sample (doc_blocks.as_run_here);
- launchers: `torchrun --nproc_per_node=2` for a torchrun example, two processes with SLURM's
  variables set by hand for a SLURM one, all on the CPU (gloo).

An example that continues another runs joined to it (one `Example` lists both blocks); a
deliberate fragment is marked on its page (`<!-- fragment: why -->`); every block is one or the
other. docs/many-gpus.md's multi-process Keras examples run in tests/test_keras_multiprocess.py.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from doc_blocks import (
    Block,
    as_run_here,
    block,
    blocks,
    environment,
    python,
    run,
    run_all,
    run_folder,
    sample_data,
)

from prefetch.testing import free_ports, serve_folder

# What a reader of a Keras example brings: a compiled model for any image size and 3 classes.
KERAS_MODEL = """
import keras


def make_model():
    layers = [keras.layers.Rescaling(1 / 255), keras.layers.GlobalAveragePooling2D()]
    model = keras.Sequential([*layers, keras.layers.Dense(3)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


model = make_model()
"""
# ... and of a PyTorch one: a model for (N, 3, H, W) batches of 3 classes, its optimizer.
TORCH_MODEL = """
import torch


def make_model():
    return torch.nn.Sequential(
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(3, 3)
    )


model = make_model()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
epochs = 1
"""


@dataclass(frozen=True)
class Example:
    """How the suite runs one example: the blocks of `page` that contain `blocks`, in order."""

    page: str
    blocks: tuple[str, ...]
    prelude: str = ""
    replace: tuple[tuple[str, str], ...] = ()
    shows: tuple[str, ...] = ()
    prints: tuple[str, ...] = ()  # regular expressions the output matches
    needs: tuple[str, ...] = ()  # modules that must be installed
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # the reader's own modules
    launcher: str | None = None  # "torchrun", "slurm"
    splice: str | None = None  # the text of the first blocks that the last one stands in for
    fresh: bool = False  # run in an empty folder: the example writes its own data
    slow: bool = False
    elsewhere: str | None = None  # the test module that runs it

    @property
    def id(self) -> str:
        """The page and the text that finds its (last) block: stable as the page grows."""
        return f"{self.page}:{self.blocks[-1]}"

    def code(self) -> str:
        """The page's code of the example: its blocks joined (or the last spliced in)."""
        parts = [block(self.page, part).code for part in self.blocks]
        if self.splice is None:
            return "\n".join(parts)
        joined = "\n".join(parts[:-1])
        assert self.splice in joined, f"{self.id}: no {self.splice!r} to stand in for"
        return joined.replace(self.splice, parts[-1])

    def program(self, url: str | None = None) -> str:
        code = self.code()
        for old, new in self.replace:
            assert old in code, f"{self.id}: the example no longer has {old!r} to replace"
            code = code.replace(old, new)
        return as_run_here(self.prelude + code, url)


TIMEOUT_S = 240  # one example, on a busy 2-core machine
R, D = "README.md", "docs/"
G, M, T = D + "getting-started.md", D + "many-gpus.md", D + "tensorflow.md"
TF, KERAS, TORCH = ("tensorflow",), ("keras",), ("torch",)
IMPORTS, TF_IMPORTS = "import prefetch\n", "import prefetch\nimport prefetch.tf\n"
ONE_EPOCH = (("epochs=10", "epochs=1"),)
# What the TF1 example's reader has: graph mode, and a training op of the queue's batches.
TF1 = """
import tensorflow as tf

import prefetch
import prefetch.tf

tf.compat.v1.disable_eager_execution()


def make_train_op(images, labels):
    logits = tf.keras.layers.Dense(3)(tf.reshape(tf.cast(images, tf.float32), [32, -1]) / 255)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
    return tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
"""
# ... and the PyDataset example's: its file list and a function that loads one file.
PYDATASET = """
import math

import numpy as np
import PIL.Image

import prefetch
import prefetch.tf

folder = prefetch.ImageFolder("data/train")
paths, labels = list(folder.paths), list(folder.labels)


def load_and_resize(path):
    return np.asarray(PIL.Image.open(path).convert("RGB").resize((224, 224)))
"""
# The shards the shard examples read, written by `prefetch shards write` from the samples.
SHARDS = """
import subprocess
import sys

subprocess.run([sys.executable, "-m", "prefetch", "shards", "write", "--quiet", *{}], check=True)
"""
TFRECORDS = SHARDS.format('["data/train", "data", "--format", "tfrecord", "--prefix", "train"]')
TARS = SHARDS.format('["data/photos", "data/shards"]')
# The lines of the torchrun example that its SLURM form stands in for.
TORCHRUN_LINES = (
    "dist.init_process_group()  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT\n"
    'local_rank = int(os.environ["LOCAL_RANK"])\n'
)
AUGMENT = "def heavy_python_augmentation(image, rng):\n    return image[:, ::-1]\n"
RESIDENT = "def train_step(images, labels):\n    pass\n\n"
SMALL = (
    ("EPOCHS, SIZE = 10, 160", "EPOCHS, SIZE = 2, 32"),
    ("EPOCHS, SIZE = 10, 224", "EPOCHS, SIZE = 2, 32"),
)
EXAMPLES = [
    Example(R, ("for images, labels in loader:  # uint8",)),
    Example(
        R, ("keras.layers.GlobalMaxPooling2D()",), replace=(("epochs=3", "epochs=1"),), needs=TF
    ),
    Example(
        R, ("prefetch.torch.DeviceLoader",), TORCH_MODEL, (("range(10)", "range(1)"),), needs=TORCH
    ),
    Example(R, ("prefetch.background(batches(), depth=2)",)),
    Example(R, ("# was: keras.utils.image_dataset_from_directory",), needs=TF),
    Example(D + "api.md", ('"data/photos", image_size=224',), IMPORTS),
    Example(D + "decoders.md", ("class RetryingDecoder",)),
    Example(D + "decoders.md", ("def decode_raw_gray",)),
    Example(D + "decoders.md", ("decoder=decode_turbo)",), IMPORTS),
    Example(D + "decoders.md", ('decoder="pillow")',), IMPORTS),
    Example(G, ('write_image_folder("data/train"',), fresh=True),
    Example(
        G,
        ("folder = prefetch.ImageFolder", "print(loader.stats())"),
        shows=(
            "ImageFolder('data/train': 300 files, 3 classes)",
            "['circle', 'square', 'triangle']",
            "600 images in 20 batches",
            "process backend",
            "2 workers busy",
        ),
        prints=(r"(?m)^10$",),
    ),
    Example(G, ("InputStatsCallback(train)",), needs=TF),
    Example(G, ('"data/train", batch_size=32, image_size=64',), IMPORTS),
    Example(
        G,
        ("write_bad_files", 'on_error=prefetch.ErrorPolicy("skip"'),
        shows=(
            "UnidentifiedImageError [\"prefetch: while reading 'data/messy/circle/bad_corrupt.jpg'",
            "(sample 0, epoch 0) in prefetch-process-0 (pid ",
            "[4, 8, 8, 8, 2]",
        ),
    ),
    Example(G, ("class Noise:",)),
    Example(G, ("def flip_and_brighten",)),
    Example(G, ("resumed.load_state_dict(state)",)),
    Example(
        M, ('os.environ["LOCAL_RANK"]',), TORCH_MODEL, launcher="torchrun", needs=TORCH, slow=True
    ),
    Example(
        M,
        ('os.environ["LOCAL_RANK"]', 'os.environ["SLURM_LOCALID"]'),
        TORCH_MODEL,
        splice=TORCHRUN_LINES,
        launcher="slurm",
        needs=TORCH,
        slow=True,
    ),
    Example(
        M, ("tf.distribute.MultiWorkerMirroredStrategy()",), elsewhere="test_keras_multiprocess.py"
    ),
    Example(M, ("jax.distributed.initialize()",), elsewhere="test_keras_multiprocess.py"),
    Example(
        D + "processes.md",
        ("heavy_python_augmentation",),
        files={"my_project/__init__.py": "", "my_project/augment.py": AUGMENT},
    ),
    Example(D + "remote.md", ('prefetch.ImageFolder("gs://my-bucket/train")',), needs=TF),
    Example(D + "remote.md", ('"/mnt/ssd/train-cache"',), IMPORTS),
    Example(D + "remote.md", ("cache_limit=200 * 2**30",), IMPORTS),
    Example(
        D + "scale.md",
        ("keep_listing=False",),
        IMPORTS + 'root = "data/train"\n',
        shows=("ListingReport(read=False, file='", "ListingReport(read=True, file='"),
    ),
    Example(D + "shards.md", ('TFRecordSource("data/train-*.tfrecord")',), TFRECORDS + TARS),
    Example(
        D + "shards.md",
        ('TarSource("shards/shard-*.tar")',),
        SHARDS.format('["photos", "shards"]') + IMPORTS,
    ),
    Example(D + "shutdown.md", ("for batch in loader:  # starts the workers", "iterator.close()")),
    Example(D + "shutdown.md", ("def batches():",), shows=("generator closed",)),
    Example(T, ("with train:  # owns the workers",), KERAS_MODEL, ONE_EPOCH, needs=TF),
    Example(
        T,
        (
            '"data/photos", image_size=(224, 224), batch_size=32',
            "with train.loader, validation.loader:",
        ),
        KERAS_MODEL,
        ONE_EPOCH,
        needs=TF,
    ),
    Example(
        T,
        ("prefetch.tf.QueueRunner(loader, num_epochs=5)",),
        replace=(("num_epochs=5", "num_epochs=1"),),
        needs=TF,
    ),
    Example(
        T,
        ("data = prefetch.tf.resident(loader, seed=0)", "data.folds(3)", "resident_stream("),
        RESIDENT,
        (("epochs=10", "epochs=1"), ("epochs=5", "epochs=1"), ("range(10)", "range(1)")),
        needs=TF,
        slow=True,
    ),
    Example(T, ("tf.distribute.MirroredStrategy()",), KERAS_MODEL, ONE_EPOCH, needs=TF),
    Example(
        T,
        ("train, val = keras.utils.image_dataset_from_directory(",),
        KERAS_MODEL,
        ONE_EPOCH,
        needs=TF,
    ),
    Example(T, ('subset="training", **options',), KERAS_MODEL + TF_IMPORTS, ONE_EPOCH, needs=TF),
    Example(
        T, ("class Photos(keras.utils.PyDataset)",), KERAS_MODEL + PYDATASET, ONE_EPOCH, needs=TF
    ),
    Example(T, ("runner.dequeue_many(32)\ntrain_op = make_train_op",), TF1, needs=TF),
    Example(
        D + "training-loops.md",
        ("# train_keras.py",),
        replace=SMALL[:1],
        env={"KERAS_BACKEND": "torch"},
        needs=KERAS + TORCH,
        slow=True,
    ),
    Example(
        D + "training-loops.md",
        ("# train_torch.py", "torch.utils.data.DataLoader(train_batches"),
        replace=SMALL[1:],
        prints=(r"epoch 1: loss \d",),
        needs=TORCH,
        slow=True,
    ),
    Example(D + "training.md", ("crop=prefetch.RandomResizedCrop(scale=",), needs=TF),
    Example(
        D + "training.md",
        ("validation_split=0.1,", "keras.applications.ResNet50"),
        "import keras\n" + TF_IMPORTS,
        (("epochs=90", "epochs=1"),),
        needs=TF,
        slow=True,
    ),
]


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sample_data(tmp_path_factory.mktemp("doc-examples"))


def test_every_block_is_run_or_marked_as_a_fragment() -> None:
    runs = {block(e.page, part).where for e in EXAMPLES for part in e.blocks}
    left: list[Block] = [b for b in blocks() if b.where not in runs and b.fragment is None]
    assert not left, "blocks neither run nor marked <!-- fragment: why -->: " + ", ".join(
        f"{b.where} ({b.code.splitlines()[0]!r})" for b in left
    )
    marked = [b.where for b in blocks() if b.where in runs and b.fragment is not None]
    assert not marked, f"blocks marked as fragments but run: {marked}"


def test_the_examples_run_elsewhere_are_run_there() -> None:
    for example in (e for e in EXAMPLES if e.elsewhere):
        text = (Path(__file__).parent / example.elsewhere).read_text(encoding="utf-8")
        assert all(part in text for part in example.blocks), (example.elsewhere, example.blocks)


@pytest.mark.parametrize(
    "example",
    [
        pytest.param(e, id=e.id, marks=[pytest.mark.slow] if e.slow else [])
        for e in EXAMPLES
        if e.elsewhere is None
    ],
)
@pytest.mark.timeout(300)
def test_the_example_runs_as_written(example: Example, sample: Path, tmp_path: Path) -> None:
    for module in example.needs:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")
    folder = tmp_path / "run" if example.fresh else run_folder(tmp_path, sample)
    (folder / "data").mkdir(parents=True, exist_ok=True)
    for name, text in example.files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text, encoding="utf-8")
    with serve_folder(folder / "data") as url:
        (folder / "example.py").write_text(example.program(url), encoding="utf-8")
        results = launch(example, folder)
    code = example.code()
    for result in results:
        assert result.returncode == 0, f"{example.id} failed:\n{result.stderr[-6000:]}"
        assert "Traceback" not in result.stderr, result.stderr[-6000:]
        assert "TooManyWorkersWarning" not in result.stderr, result.stderr[-3000:]
        for shown in example.shows:
            assert shown in code, f"{example.id}: the page no longer shows {shown!r}"
            assert shown in result.stdout, f"{example.id} did not print {shown!r}:\n{result.stdout}"
        for pattern in example.prints:
            assert re.search(pattern, result.stdout), (
                f"{example.id}: no {pattern!r} in\n{result.stdout}"
            )


def launch(example: Example, folder: Path) -> list[subprocess.CompletedProcess[str]]:
    """Run the example's script as its launcher would; the result of each process."""
    env = environment(**example.env)
    if example.launcher is None:
        return [run(python(folder / "example.py"), folder, env, TIMEOUT_S)]
    port = str(free_ports(1)[0])
    if example.launcher == "torchrun":
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
        return [run([*torchrun, f"--master_port={port}", "example.py"], folder, env, TIMEOUT_S)]
    assert example.launcher == "slurm", example.launcher
    # srun's variables for 2 tasks on this host, and the rendezvous the job script exports.
    tasks = [
        dict(env, SLURM_PROCID=str(i), SLURM_LOCALID=str(i), SLURM_NTASKS="2",
             MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        for i in range(2)
    ]  # fmt: skip
    return run_all([python(folder / "example.py")] * 2, folder, tasks, TIMEOUT_S)
