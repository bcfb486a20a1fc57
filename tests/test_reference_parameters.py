"""The generated reference documents every parameter of every public callable.

mkdocstrings renders the docstrings as Markdown (`docstring_style: null` in mkdocs.yml), so a
parameter is documented when the docstring of its function, or of its class (the constructor
is merged into the class's entry), has a list item for it, "- `name`: what it is", as Keras's
and tf.data's references list theirs; or when the reference page lists it right under the
object's `:::` directive (rendered under its entry). These tests read the
docstrings and the pages; `mkdocs build --strict` renders them.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path

import pytest

import prefetch

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference"
DIRECTIVE = re.compile(r"^::: *(?P<identifier>\S+) *$", re.MULTILINE)


def page_sections() -> dict[str, str]:
    """The Markdown under each `:::` directive of the reference pages, up to the next one."""
    sections = {}
    for page in sorted(REFERENCE.glob("*.md")):
        text = page.read_text(encoding="utf-8")
        matches = list(DIRECTIVE.finditer(text))
        for match, following in zip(matches, [*matches[1:], None], strict=True):
            end = following.start() if following is not None else len(text)
            sections[match["identifier"]] = text[match.end() : end]
    return sections


def documented_parameters(obj: Callable[..., object]) -> tuple[list[str], str]:
    """The parameters of `obj`'s signature (its constructor's, for a class) and the docstring
    the reference shows for it (the class's and its `__init__`'s, merged as mkdocstrings
    merges them)."""
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):  # a builtin without a signature
        return [], ""
    names = [
        p.name
        for p in signature.parameters.values()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name != "self"
    ]
    doc = inspect.getdoc(obj) or ""
    if inspect.isclass(obj):
        init = obj.__dict__.get("__init__")
        doc += "\n" + (inspect.getdoc(init) or "" if init is not None else "")
    return names, doc


def undocumented(obj: Callable[..., object], path: str) -> list[str]:
    """The parameters of `obj` (public as `path`) that neither its docstring nor its entry on
    the reference page lists."""
    names, doc = documented_parameters(obj)
    doc += "\n" + page_sections().get(path, "")
    return [name for name in names if not re.search(rf"^\s*- `{re.escape(name)}`", doc, re.M)]


@pytest.mark.parametrize("name", prefetch.__all__)
def test_every_parameter_of_a_public_callable_of_prefetch_is_documented(name: str) -> None:
    obj = getattr(prefetch, name)
    if not callable(obj):
        pytest.skip(f"prefetch.{name} is not callable")
    missing = undocumented(obj, f"prefetch.{name}")
    assert not missing, f"prefetch.{name}: no docstring or reference entry describes {missing}"


@pytest.mark.tf
def test_every_parameter_of_a_public_callable_of_prefetch_tf_is_documented() -> None:
    pytest.importorskip("tensorflow")
    import prefetch.tf

    missing = {
        name: undocumented(getattr(prefetch.tf, name), f"prefetch.tf.{name}")
        for name in prefetch.tf.__all__
        if callable(getattr(prefetch.tf, name))
    }
    missing = {name: params for name, params in missing.items() if params}
    assert not missing, f"prefetch.tf docstrings that do not describe their parameters: {missing}"


def test_the_loader_reference_names_its_option_groups() -> None:
    doc = inspect.getdoc(prefetch.Loader) or ""
    assert "Parameters:" in doc
    for group in ("Augment", "ErrorPolicy", "Autotune", "ProcessOptions", "RemoteOptions"):
        assert f"{group}(" in doc, group


# The readthedocs theme keeps every table cell on one line (`white-space: nowrap`) and scrolls a
# table wider than the 800 px content column, so a row of the index must stay short: about 90
# characters of its text fill the column at the theme's font sizes.
INDEX_ROW_CHARS = 80


def test_the_index_tables_of_the_api_page_fit_the_theme() -> None:
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    index = text.split("## The Loader's options and behaviour", 1)[0]
    rows = [line for line in index.splitlines() if line.startswith("|") and "---" not in line]
    assert len(rows) > 10
    for row in rows:
        visible = re.sub(r"\]\([^)]*\)", "]", row)  # a link shows its text only
        visible = re.sub(r"[\[\]`|]", "", visible).strip()
        assert len(visible) <= INDEX_ROW_CHARS, f"too wide for the theme ({len(visible)}): {row}"
    for header in (line for line in rows if line.startswith("| to")):
        assert header.count("|") == 3, f"two columns at most: {header}"
