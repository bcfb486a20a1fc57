"""A state is checked at the door (issue 45, item 5): `load_state_dict` refuses every field that
is not what `state_dict` gives, naming the field, its value and the fix; `state_dict(held_back=)`
refuses a count that is not among the batches the running epoch delivered; and what JAX
reports as its process count and index is checked before a loader is sharded by it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import prefetch
from prefetch.testing import write_image_folder

OPTIONS: dict[str, Any] = dict(image_size=(8, 8), workers=1, seed=5, backend="thread")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_image_folder(tmp_path_factory.mktemp("checks"), per_class=7, size=(10, 10))


@pytest.fixture
def state(folder: Path) -> dict[str, int]:
    """A state taken after 2 batches of 4 on 1 rank (21 samples: 6 batches)."""
    loader = prefetch.Loader(folder, batch_size=4, **OPTIONS)
    with loader:
        stream = iter(loader)
        next(stream), next(stream)
        taken = loader.state_dict()
        stream.close()
    assert taken["position"] == 2 and taken["samples"] == 8
    return taken


@pytest.mark.parametrize(
    "change, refusal",
    [
        ({"num_shards": 0}, "'num_shards' must be an int >= 1, got 0"),
        ({"batch_size": 0}, "'batch_size' must be an int >= 1, got 0"),
        ({"size": 0}, "'size' must be an int >= 1, got 0"),
        ({"position": 2.0}, "'position' must be an int >= 0, got 2.0"),
        ({"samples": True}, "'samples' must be an int >= 0, got True"),
        ({"seed": "5"}, "'seed' must be an int >= 0, got '5'"),
        ({"seed": -1}, "'seed' must be an int >= 0, got -1"),
        ({"epoch": -1}, "'epoch' must be an int >= 0, got -1"),
        ({"position": 7}, "'position' is 7, past the epoch of 6 batches that its layout has"),
        ({"samples": 22}, "'samples' is 22, past the epoch of its 'size' 21 samples"),
        ({"version": True}, "version True; this prefetch reads versions 1 and 2"),
        ({"version": 2.0}, r"version 2\.0; this prefetch reads versions 1 and 2"),
        ({"version": 3}, "version 3; this prefetch reads versions 1 and 2"),
        ({"postion": 2}, r"keys a version-2 state has not, \['postion'\]"),
        ({"version": None}, "version None; this prefetch reads"),
    ],
)  # fmt: skip
def test_a_state_with_a_bad_field_is_refused_naming_the_field_its_value_and_the_fix(
    folder: Path, state: dict[str, int], change: dict[str, Any], refusal: str
) -> None:
    loader = prefetch.Loader(folder, batch_size=4, **OPTIONS)
    before = loader.state_dict()
    with pytest.raises(ValueError, match=refusal) as refused:
        loader.load_state_dict({**state, **change})
    if "version" not in change:
        assert "pass the dict state_dict() gave, unchanged" in str(refused.value)
    assert loader.state_dict() == before  # nothing of the bad state was taken
    loader.load_state_dict(state)  # the good one still loads
    assert loader.state_dict() == state


def test_a_version_2_state_without_its_version_is_refused_not_read_as_version_1(
    folder: Path, state: dict[str, int]
) -> None:
    # Read as version 1, its position would be taken as this loader's own layout's: on 2 ranks
    # that is twice the samples the state was taken at.
    loader = prefetch.Loader(folder, batch_size=4, **OPTIONS)
    loader.shard(2, 0)
    unversioned = {key: value for key, value in state.items() if key != "version"}
    with pytest.raises(ValueError, match=r"keys a version-1 state has not, \['batch_size'"):
        loader.load_state_dict(unversioned)
    loader.load_state_dict(json.loads(json.dumps(state)))
    assert loader.state_dict()["samples"] == state["samples"]


def test_held_back_is_refused_outside_the_batches_the_running_epoch_delivered(
    folder: Path,
) -> None:
    loader = prefetch.Loader(folder, batch_size=4, **OPTIONS)
    with pytest.raises(ValueError, match=r"from 0 to the 0 .* got held_back=1"):
        loader.state_dict(held_back=1)  # nothing delivered yet
    with loader:
        stream = iter(loader)
        next(stream)
        for bad in (3, 2, -4, -1, 1.0, True):
            with pytest.raises(ValueError, match=rf"from 0 to the 1 .* got held_back={bad!r}"):
                loader.state_dict(held_back=bad)  # type: ignore[arg-type]
        assert loader.state_dict(held_back=1)["position"] == 0
        assert loader.state_dict(held_back=0)["position"] == 1
        stream.close()
    # A state loaded mid-epoch delivered nothing of its own yet: only 0 is held back.
    loader.load_state_dict({**loader.state_dict(), "position": 3, "samples": 12})
    with pytest.raises(ValueError, match="from 0 to the 0"):
        loader.state_dict(held_back=1)


JAX_ANSWERS = """
import json, sys
import keras
import prefetch.keras
from prefetch.testing import fake_jax
answers = {}
for name, count, index in (("none", None, 0), ("float", 2.9, 1), ("bool", True, 0),
                           ("zero", 0, 0), ("index", 3, 3), ("index none", 3, None),
                           ("good", 3, 2)):
    sys.modules["jax"] = fake_jax(count, index)
    try:
        answers[name] = list(prefetch.keras.jax_processes())
    except Exception as error:
        answers[name] = type(error).__name__ + ": " + str(error)
print(json.dumps(answers))
"""


@pytest.mark.slow
@pytest.mark.timeout(120)  # a subprocess that imports Keras and torch
def test_what_jax_reports_as_its_processes_is_checked_before_the_loader_is_sharded(
    tmp_path: Path,
) -> None:
    pytest.importorskip("keras")
    pytest.importorskip("torch")
    script = tmp_path / "answers.py"
    script.write_text(JAX_ANSWERS)
    here = str(Path(prefetch.__file__).resolve().parent.parent)  # the prefetch under test
    result = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "KERAS_BACKEND": "torch", "PYTHONPATH": here},
        capture_output=True, text=True, timeout=110,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    answers = json.loads(result.stdout.strip().splitlines()[-1])
    assert answers["good"] == [3, 2]
    for name, said in (
        ("none", "jax.process_count() returned None, not an int >= 1"),
        ("float", "jax.process_count() returned 2.9, not an int >= 1"),
        ("bool", "jax.process_count() returned True, not an int >= 1"),
        ("zero", "jax.process_count() returned 0, not an int >= 1"),
        ("index", "jax.process_index() returned 3, not an int in [0, 3)"),
        ("index none", "jax.process_index() returned None, not an int in [0, 3)"),
    ):
        assert answers[name].startswith("ValueError: " + said), (name, answers[name])
        assert "distributed=False" in answers[name]
