"""The house keeps its shape (issue 26's targets), read from the source, not hoped for.

Each check walks prefetch/ with `ast` and names every offending file and line with its fix:

- no module over 400 lines; the Loader class at most 250 lines besides its docstring;
- no function-level import of a prefetch module (a function that imports our own modules is
  hiding a circle; imports under a module-level `if TYPE_CHECKING:` and imports of third-party
  packages, optional ones such as TensorFlow included, are fine anywhere);
- no access to another module's underscore names. The rule, precise enough to flag no
  legitimate code:
  * a private module (`prefetch.io._storage`, any component `_x` that is not a dunder) is
    imported only from inside its own package: by the package's `__init__`, its sibling modules
    and their subpackages. Everyone else imports from the package (`from prefetch.io import x`);
  * a private attribute of a module (`from prefetch.x import _y`, `module._y` where `module` is
    a name bound to an imported prefetch module) is not used outside that module at all;
  * `obj._y` on anything but `self`, `cls` or `super()` is flagged when `_y` is defined
    (`self._y = ...`, `def _y`, `_y: T` in a class body) only by classes of *other* prefetch
    modules: that is reaching into another module's object (the Loader/Stream seam). A name some
    class of the same module also defines is that module's own business and passes, and so does
    a private name that no prefetch class defines (`sys._getframe`) or a named tuple's
    documented `_replace`, `_asdict`, `_make`, `_fields`.
- no import cycle among prefetch's modules, inside packages too (grimp's graph, the one
  import-linter reads; `if TYPE_CHECKING:` imports are types and left out);
- the layers: `lint-imports` (import-linter) keeps the contracts in pyproject.toml: the layers
  along the data path, the package root imported only by tools and cli, the tools independent
  of each other, private modules used only inside their package.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "prefetch"
MAX_MODULE_LINES = 400  # issue 26's target for every module
MAX_LOADER_LINES = 250  # the Loader class, besides its docstring

pytestmark = pytest.mark.timeout(120)


@dataclass(frozen=True)
class Module:
    path: Path  # prefetch/io/_storage.py
    name: str  # prefetch.io._storage
    package: str  # prefetch.io (for an __init__, the package itself)
    tree: ast.Module

    @property
    def where(self) -> str:
        return str(self.path.relative_to(ROOT))


def _modules() -> list[Module]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_init = parts[-1] == "__init__"
        if is_init:
            parts.pop()
        name = ".".join(parts)
        package = name if is_init else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        found.append(Module(path, name, package, tree))
    return found


MODULES = _modules()


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def is_module(dotted: str) -> bool:
    """Whether `dotted` names a module or package of ours (a C extension included)."""
    if dotted != "prefetch" and not dotted.startswith("prefetch."):
        return False
    path = ROOT.joinpath(*dotted.split("."))
    return (
        path.with_suffix(".py").is_file()
        or (path / "__init__.py").is_file()
        or any(path.parent.glob(f"{path.name}.*.so"))
    )


def absolute(module: Module, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` reads from."""
    if node.level == 0:
        return node.module or ""
    base = module.package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def is_ours(dotted: str) -> bool:
    return dotted == "prefetch" or dotted.startswith("prefetch.")


def private_module_misuse(importer: str, dotted: str) -> str | None:
    """The first private module in `dotted` that `importer` may not reach, or None.

    A private module may be used by its own package's __init__ and by the package's other
    modules (and their subpackages), nobody else."""
    parts = dotted.split(".")
    for i in range(1, len(parts)):
        prefix = ".".join(parts[: i + 1])
        if not is_private(parts[i]) or not is_module(prefix):
            continue
        parent = ".".join(parts[:i])
        if importer != parent and not importer.startswith(parent + "."):
            return prefix
    return None


def walk_with_scope(tree: ast.Module) -> Iterator[tuple[ast.AST, bool]]:
    """Every node with whether it lies inside a function or class body."""

    def visit(node: ast.AST, nested: bool) -> Iterator[tuple[ast.AST, bool]]:
        yield node, nested
        inner = nested or isinstance(
            node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda
        )
        for child in ast.iter_child_nodes(node):
            yield from visit(child, inner)

    yield from visit(tree, False)


def report(problems: list[str], what: str) -> str:
    return f"{len(problems)} {what}:\n" + "\n".join(problems)


# --- size --------------------------------------------------------------------------------------


def test_no_module_is_over_400_lines() -> None:
    problems = []
    for module in MODULES:
        lines = len(module.path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_MODULE_LINES:
            problems.append(
                f"{module.where}:{MAX_MODULE_LINES + 1}: {lines} lines, at most "
                f"{MAX_MODULE_LINES}: split it along a seam of the data path into private "
                "modules of its package (tests move with the code)"
            )
    assert not problems, report(problems, "modules over 400 lines")


def test_the_loader_class_is_at_most_250_lines_besides_its_docstring() -> None:
    module = next(m for m in MODULES if m.name == "prefetch.runtime._loader")
    classes = [n for n in module.tree.body if isinstance(n, ast.ClassDef) and n.name == "Loader"]
    assert classes, f"{module.where}: no class Loader: update tests/test_layout.py if it moved"
    loader = classes[0]
    assert loader.end_lineno is not None
    lines = loader.end_lineno - loader.lineno + 1
    docstring = loader.body[0]
    if (
        isinstance(docstring, ast.Expr)
        and isinstance(docstring.value, ast.Constant)
        and isinstance(docstring.value.value, str)
    ):
        assert docstring.end_lineno is not None
        lines -= docstring.end_lineno - docstring.lineno + 1
    assert lines <= MAX_LOADER_LINES, (
        f"{module.where}:{loader.lineno}: class Loader has {lines} lines besides its docstring, "
        f"at most {MAX_LOADER_LINES}: move work that is not the user's handle (the epoch, its "
        "stream, option checks) into the objects that own it"
    )


# --- imports -----------------------------------------------------------------------------------


def test_no_function_level_import_of_a_prefetch_module() -> None:
    problems = []
    for module in MODULES:
        for node, nested in walk_with_scope(module.tree):
            if not nested:
                continue
            if isinstance(node, ast.ImportFrom):
                source = absolute(module, node)
                submodules = [f"{source}.{a.name}" for a in node.names]
                targets = [m for m in submodules if is_module(m)] or [source]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            for target in targets:
                if is_ours(target):
                    problems.append(
                        f"{module.where}:{node.lineno}: imports {target} inside a function or "
                        "class: import it at the top of the module; if that makes a circle, "
                        "move the code to the layer that owns it (a module-level "
                        "`if TYPE_CHECKING:` import serves annotations)"
                    )
    assert not problems, report(problems, "function-level imports of prefetch modules")


def module_bindings(module: Module) -> dict[str, str]:
    """Names this module binds to prefetch modules (`import prefetch.io as io` -> io)."""
    bound = {}
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not is_ours(alias.name):
                    continue
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    head = alias.name.partition(".")[0]
                    bound[head] = head
        elif isinstance(node, ast.ImportFrom):
            source = absolute(module, node)
            if not is_ours(source):
                continue
            for alias in node.names:
                if is_module(f"{source}.{alias.name}"):
                    bound[alias.asname or alias.name] = f"{source}.{alias.name}"
    return bound


def dotted_name(node: ast.expr) -> list[str] | None:
    """`a.b.c` as ["a", "b", "c"]; None for anything but names and attributes."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def private_names_of_classes(module: Module) -> dict[str, set[str]]:
    """Private attributes each class of the module defines (methods, class-body names,
    `self._x = ...`), by name: {"_start": {"Loader"}}."""
    names: dict[str, set[str]] = {}
    for cls in ast.walk(module.tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        for node in ast.walk(cls):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                name = node.name
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                name = node.id
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                name = node.attr
            else:
                continue
            if is_private(name):
                names.setdefault(name, set()).add(cls.name)
    return names


CLASS_PRIVATES = {module.name: private_names_of_classes(module) for module in MODULES}
# A named tuple's documented API, public despite the underscore (`url._replace(path=...)`).
NAMEDTUPLE_API = {"_replace", "_asdict", "_make", "_fields", "_field_defaults"}


def private_access_problems(module: Module) -> Iterator[str]:
    where = module.where
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if is_ours(alias.name) and (bad := private_module_misuse(module.name, alias.name)):
                    yield (
                        f"{where}:{node.lineno}: imports private module {bad} from outside its "
                        f"package: import from {bad.rpartition('.')[0]} (export the name from "
                        "its __init__)"
                    )
        elif isinstance(node, ast.ImportFrom):
            source = absolute(module, node)
            if not is_ours(source):
                continue
            if bad := private_module_misuse(module.name, source):
                yield (
                    f"{where}:{node.lineno}: imports from private module {bad} outside its "
                    f"package: import from {bad.rpartition('.')[0]} (export the name from its "
                    "__init__)"
                )
                continue
            for alias in node.names:
                target = f"{source}.{alias.name}"
                if not is_private(alias.name):
                    continue
                if is_module(target):
                    if bad := private_module_misuse(module.name, target):
                        yield (
                            f"{where}:{node.lineno}: imports private module {bad} from outside "
                            f"its package: import from {source} (export the name from its "
                            "__init__)"
                        )
                elif source != module.name:
                    yield (
                        f"{where}:{node.lineno}: imports private name {alias.name} of {source}: "
                        f"make it public in {source} (without the underscore), or move the "
                        "code that needs it there"
                    )
    bound = module_bindings(module)
    own = CLASS_PRIVATES[module.name]
    for node in ast.walk(module.tree):
        if not isinstance(node, ast.Attribute) or not is_private(node.attr):
            continue
        parts = dotted_name(node)
        if parts and parts[0] in bound and not isinstance(node.ctx, ast.Del):
            dotted = ".".join([bound[parts[0]], *parts[1:]])
            owner = dotted.rpartition(".")[0]
            if is_module(dotted):
                if bad := private_module_misuse(module.name, dotted):
                    yield (
                        f"{where}:{node.lineno}: uses private module {bad} from outside its "
                        f"package: use {bad.rpartition('.')[0]} (export the name from its "
                        "__init__)"
                    )
            elif is_module(owner) and owner != module.name:
                yield (
                    f"{where}:{node.lineno}: uses private name {node.attr} of module {owner}: "
                    f"make it public in {owner}, or move the code that needs it there"
                )
            continue
        value = node.value
        if isinstance(value, ast.Name) and value.id in ("self", "cls"):
            continue
        if (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id == "super"
        ):
            continue
        if node.attr in own or node.attr in NAMEDTUPLE_API:
            continue
        owners = sorted(
            f"{cls} ({name})"
            for name, names in CLASS_PRIVATES.items()
            for cls in names.get(node.attr, ())
            if name != module.name
        )
        if owners:
            yield (
                f"{where}:{node.lineno}: reaches into {ast.unparse(node)}, private to "
                f"{' or '.join(owners)}: give that class a public method or property for what "
                "this module needs"
            )


def test_no_module_touches_another_modules_underscore_names() -> None:
    problems = [problem for module in MODULES for problem in private_access_problems(module)]
    problems.sort(key=lambda line: (line.split(":")[0], int(line.split(":")[1])))
    assert not problems, report(problems, "uses of another module's private names")


def test_the_layers_hold() -> None:
    command = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    command = command or shutil.which("lint-imports")
    if command is None:
        pytest.skip("lint-imports is not installed: pip install -e '.[test]' (import-linter)")
    done = subprocess.run(
        [command, str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=110,
    )
    broken = done.stdout.partition("Broken contracts")[2] or done.stdout + done.stderr
    assert done.returncode == 0, f"lint-imports (contracts in pyproject.toml):\n{broken}"


def import_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in sorted(edges[module]):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return cycles


def test_no_import_cycle_among_prefetchs_modules() -> None:
    """What runs at import time is acyclic, inside packages too (the layers contract sees only
    imports between layers); imports under `if TYPE_CHECKING:` are types, not a circle."""
    grimp = pytest.importorskip("grimp", reason="grimp comes with import-linter: .[test]")
    graph = grimp.build_graph(
        "prefetch", include_external_packages=False, exclude_type_checking_imports=True
    )
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}

    cycles = import_cycles(edges)

    assert not cycles, "import cycles (break each by moving the shared code down a module):\n" + (
        "\n".join(" <-> ".join(group) for group in cycles)
    )


def test_the_cycle_finder_finds_a_circle_and_passes_a_chain() -> None:
    chain = {"a": {"b"}, "b": {"c"}, "c": set()}
    circle = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}

    assert import_cycles(chain) == []
    assert import_cycles(circle) == [["a", "b", "c"]]
