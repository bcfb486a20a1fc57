"""Tests that the generated API reference covers the public names, by their public paths.

The reference pages (docs/reference/*.md) are `::: identifier` directives that mkdocstrings
renders from the docstrings when `make docs` or `make test` builds the site (`mkdocs build
--strict`; these tests do not build it). A name added to `prefetch.__all__` or
`prefetch.tf.__all__` must get a directive, written with its public path (`::: prefetch.Loader`,
never the module it lives in, which may move), and a docstring to render.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

import prefetch

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference"
DIRECTIVE = re.compile(r"^::: *(?P<identifier>\S+) *$", re.MULTILINE)
# Modules private behind the curated `__init__`: their layout changes (the architecture issue),
# so the reference never names them or anything in them.
INTERNAL_MODULES = (
    "prefetch.runtime._loader",
    "prefetch.backends",
    "prefetch.sample",
    "prefetch.runtime._stream",
    "prefetch.plan._epochs",
    "prefetch.runtime._options",
    "prefetch.runtime._autoscale",
)


def reference_identifiers() -> list[str]:
    """Every `:::` identifier on the reference pages, in page order."""
    return [
        match["identifier"]
        for page in sorted(REFERENCE.glob("*.md"))
        for match in DIRECTIVE.finditer(page.read_text(encoding="utf-8"))
    ]


def tf_public_names() -> list[str]:
    """`prefetch.tf.__all__`, read from its source so that TensorFlow need not be imported."""
    tree = ast.parse((ROOT / "prefetch" / "tf" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            names = ast.literal_eval(node.value)
            assert isinstance(names, list)
            return [str(name) for name in names]
    raise AssertionError("prefetch/tf/__init__.py defines no __all__")


def public_paths() -> list[str]:
    return [f"prefetch.{name}" for name in prefetch.__all__] + [
        f"prefetch.tf.{name}" for name in tf_public_names()
    ]


def has_own_docstring(obj: object) -> bool:
    """Whether `obj` has a docstring of its own (not the signature a dataclass writes)."""
    doc = obj.__doc__ if inspect.isclass(obj) else inspect.getdoc(obj)
    if not doc or not doc.strip():
        return False
    name = getattr(obj, "__name__", "")
    return not (inspect.isclass(obj) and doc.startswith(f"{name}("))


def test_the_reference_pages_exist_and_hold_directives() -> None:
    assert REFERENCE.is_dir()
    assert len(reference_identifiers()) >= len(public_paths())


@pytest.mark.parametrize("path", public_paths())
def test_every_public_name_has_a_directive_under_its_public_path(path: str) -> None:
    documented = path in reference_identifiers()
    assert documented, (
        f"{path} is public but no docs/reference/*.md page has a `::: {path}` directive; "
        "add one to the page where it belongs (see mkdocs.yml's nav)"
    )


def test_directives_name_no_internal_or_private_module() -> None:
    for identifier in reference_identifiers():
        assert not any(part.startswith("_") for part in identifier.split(".")), identifier
        assert not any(
            identifier == m or identifier.startswith(m + ".") for m in INTERNAL_MODULES
        ), f"`::: {identifier}` names an internal module; use the public path"


def resolve(identifier: str) -> object:
    """The object a `:::` identifier names, imported as mkdocstrings would find it."""
    try:
        return importlib.import_module(identifier)
    except ModuleNotFoundError:
        module_name, _, attribute = identifier.rpartition(".")
        module = importlib.import_module(module_name)
        assert hasattr(module, attribute), f"`::: {identifier}`: no such object"
        return getattr(module, attribute)


def test_directives_outside_prefetch_tf_name_objects_that_exist_by_their_public_path() -> None:
    public = {id(getattr(prefetch, name)): f"prefetch.{name}" for name in prefetch.__all__}
    for identifier in reference_identifiers():
        if identifier.startswith("prefetch.tf"):
            continue  # importing it imports TensorFlow; the tf test below covers its names
        obj = resolve(identifier)
        if id(obj) in public and not identifier.startswith("prefetch.tf."):
            assert identifier == public[id(obj)], (
                f"`::: {identifier}` documents a public name: write `::: {public[id(obj)]}`"
            )


def test_the_loader_options_table_names_exactly_the_loader_keyword_options() -> None:
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    table = text.split("All other arguments are keyword-only:", 1)[1].split("\n\n", 2)[1]
    documented = re.findall(r"^\| `(\w+)` \|", table, re.MULTILINE)
    parameters = inspect.signature(prefetch.Loader).parameters.values()
    keyword_only = [p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert sorted(documented) == sorted(keyword_only), (
        "docs/api.md's table of the Loader's options is out of date: "
        f"undocumented {sorted(set(keyword_only) - set(documented))}, "
        f"gone {sorted(set(documented) - set(keyword_only))}"
    )


@pytest.mark.parametrize("name", prefetch.__all__)
def test_every_public_name_of_prefetch_has_a_docstring(name: str) -> None:
    assert has_own_docstring(getattr(prefetch, name)), f"prefetch.{name} has no docstring"


@pytest.mark.tf
def test_every_public_name_of_prefetch_tf_has_a_docstring() -> None:
    pytest.importorskip("tensorflow")
    import prefetch.tf

    assert sorted(prefetch.tf.__all__) == sorted(tf_public_names())
    missing = [n for n in prefetch.tf.__all__ if not has_own_docstring(getattr(prefetch.tf, n))]
    assert not missing, f"prefetch.tf names without a docstring: {missing}"


def test_the_cli_reference_shows_the_help_of_every_command_at_every_depth() -> None:
    # docs/hooks.py replaces a marker on docs/reference/cli.md with the parser's help: a
    # nested command (`prefetch shards write`) and its flags must be there too.
    import argparse

    from prefetch.cli import build_parser

    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    page = hooks.on_page_markdown((REFERENCE / "cli.md").read_text(encoding="utf-8"))

    def commands(parser: argparse.ArgumentParser, name: str) -> list[tuple[str, list[str]]]:
        flags = [flag for action in parser._actions for flag in action.option_strings]
        found = [(name, flags)]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child, subparser in action.choices.items():
                    found += commands(subparser, f"{name} {child}")
        return found

    every = commands(build_parser(), "prefetch")
    assert "prefetch shards write" in [name for name, _ in every]
    for name, flags in every:
        assert f"`{name}`" in page, name
        section = page.split(f"`{name}`", 1)[1]
        for flag in flags:
            assert flag in section, (name, flag)
