"""The ```python blocks of README.md and docs/*.md, and how the suite runs them as a reader would.

Used by tests/test_doc_examples.py (every block) and tests/test_keras_multiprocess.py (the
multi-process Keras examples of docs/many-gpus.md). Not collected on its own.

- `blocks()`: every block, with its page, line and code (an indented block, inside a list,
  dedented). A block the page marks `<!-- fragment: why -->` on the line before its fence is a
  deliberate fragment: the reason is kept, and the block is not run alone.
- `sample_data(root)`: the folders the examples read: `data/train` and `data/validation` as
  docs/getting-started.md's first block writes them (3 classes of shapes, 300 and 75 JPEGs of
  96x96), and `data/photos`, a small folder (12 JPEGs) for the examples that train a large
  model or split a folder.
- `run_folder(tmp_path, sample)`: a fresh working directory for one example, whose `data/`
  holds links to the sample folders (so what an example writes stays its own); the paths an
  example names that are not `data/...` are linked there too (`photos`, `data/val`,
  `data/imagenet/train`).
- `as_run_here(code, url)`: the substitutions every example gets, none of which changes what
  it does: an absolute path becomes one in the run's folder (`"/mnt/ssd/cache"` ->
  `"mnt/ssd/cache"`), and a bucket or web URL (`gs://my-bucket/`, `s3://bucket/`,
  `https://example.org/...`) the loopback server (`prefetch.testing.serve_folder`) that serves
  the run's folder.
- `run(command, cwd, env, timeout_s)`: one process, its output captured; `run_all`: several at
  once (the ranks of a job).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from prefetch.testing import write_image_folder

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(?P<indent>[ \t]*)```python[ \t]*$")
FRAGMENT = re.compile(r"^\s*<!--\s*fragment:\s*(?P<reason>\S.*?)\s*-->\s*$")
# The paths the examples name that the sample folders stand in for, besides data/train,
# data/validation and data/photos: link name -> sample folder.
LINKS = {
    "data/val": "data/validation",
    "data/imagenet/train": "data/train",
    "photos": "data/photos",
}
# Bucket and web URLs of the examples, each served by the loopback server.
URL = re.compile(r"(gs|s3)://[\w.-]+/|https://example\.org/(images/)?")
ABSOLUTE = re.compile(r"""(?P<quote>["'])/(?P<path>(data|mnt|scratch)/[^"']*)(?P=quote)""")


@dataclass(frozen=True)
class Block:
    """One ```python block of a page."""

    page: str  # README.md, docs/getting-started.md
    line: int  # of its opening fence, from 1
    code: str
    fragment: str | None  # the reason the page gives, for a block marked as a fragment

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks() -> list[Block]:
    """Every ```python block of README.md and docs/*.md, in page order."""
    found = []
    for path in PAGES:
        lines = path.read_text(encoding="utf-8").splitlines()
        page = str(path.relative_to(ROOT))
        index = 0
        while index < len(lines):
            fence = FENCE.match(lines[index])
            if fence is None:
                index += 1
                continue
            end = lines.index(f"{fence['indent']}```", index + 1)
            before = next((line for line in reversed(lines[:index]) if line.strip()), "")
            marked = FRAGMENT.match(before)
            code = textwrap.dedent("\n".join(lines[index + 1 : end])) + "\n"
            found.append(Block(page, index + 1, code, marked["reason"] if marked else None))
            index = end + 1
    return found


def block(page: str, contains: str) -> Block:
    """The one block of `page` whose code contains `contains`."""
    found = [b for b in blocks() if b.page == page and contains in b.code]
    assert len(found) == 1, f"{page} has {len(found)} python blocks with {contains!r}, not 1"
    return found[0]


def sample_data(root: Path) -> Path:
    """Write the sample folders under `root` (see the module docstring) and return `root`."""
    write_image_folder(root / "data" / "train", per_class=100, size=(96, 96), seed=0)
    write_image_folder(root / "data" / "validation", per_class=25, size=(96, 96), seed=1)
    write_image_folder(root / "data" / "photos", per_class=4, size=(120, 90), seed=2)
    return root


def run_folder(tmp_path: Path, sample: Path) -> Path:
    """A fresh working directory whose paths lead to the sample folders."""
    folder = tmp_path / "run"
    for name in ("train", "validation", "photos"):
        (folder / "data").mkdir(parents=True, exist_ok=True)
        (folder / "data" / name).symlink_to(sample / "data" / name)
    for link, target in LINKS.items():
        (folder / link).parent.mkdir(parents=True, exist_ok=True)
        (folder / link).symlink_to(sample / target)
    return folder


def as_run_here(code: str, url: str | None = None) -> str:
    """`code` with its absolute paths made relative, its URLs `url` (see the docstring)."""
    code = ABSOLUTE.sub(r"\g<quote>\g<path>\g<quote>", code)
    if url is not None:
        code = URL.sub(url, code)
    return code


def environment(**extra: str) -> dict[str, str]:
    """The test's environment, CPU only, with the checkout importable."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def run(
    command: list[str], cwd: Path, env: dict[str, str], timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """Run `command` in `cwd` to its end (killed past `timeout_s`), its output captured."""
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )


def python(script: Path) -> list[str]:
    """The command that runs `script` with this interpreter."""
    return [sys.executable, str(script)]


def run_all(
    commands: list[list[str]], cwd: Path, envs: list[dict[str, str]], timeout_s: float
) -> list[subprocess.CompletedProcess[str]]:
    """Run the commands at once in `cwd` (the ranks of a job), each to its end, their output
    in files of `cwd` (a full pipe would stall a rank); all are killed past `timeout_s` (a rank
    that hangs in a collective), and nothing outlives the call."""
    logs = [(cwd / f"rank{i}.out", cwd / f"rank{i}.err") for i in range(len(commands))]
    processes = []
    try:
        for command, env, (out, err) in zip(commands, envs, logs, strict=True):
            with open(out, "w") as stdout, open(err, "w") as stderr:
                processes.append(
                    subprocess.Popen(command, cwd=cwd, env=env, stdout=stdout, stderr=stderr)
                )
        for process in processes:
            process.wait(timeout=timeout_s)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait()
    return [
        subprocess.CompletedProcess(p.args, p.returncode, out.read_text(), err.read_text())
        for p, (out, err) in zip(processes, logs, strict=True)
    ]
