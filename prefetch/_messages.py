"""How prefetch words what it tells people: counted nouns, short numbers, unknown keywords.

`counted(1, "shard")` is "1 shard", `counted(2, "shard")` "2 shards" (reprs and messages never
say "1 shards"); `short(4 / 3)` is "1.333" (four significant digits, for floats in reprs);
`sized(3 * 2**10)` is "3 KiB" (a size in the unit that shows it: never "0 MiB").
`suggest_keywords` decorates a public function or class (its `__init__`): a call with a keyword
it does not accept raises TypeError with Python's own wording and the close matches among the
accepted keywords (`difflib.get_close_matches`: "did you mean image_size?"), or else all of
them; `moved_keywords` names the new spelling of a removed keyword instead. A call with only
known keywords costs one set lookup per keyword; signatures, pickling and docs are unchanged.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`count` and `noun`, plural unless the count is 1: "1 shard", "3 shards", "0 classes"
    (`plural` when adding "s" is wrong; nouns ending in s, x, ch or sh take "es")."""
    if count == 1:
        return f"{count} {noun}"
    if plural is None:
        plural = noun + ("es" if noun.endswith(("s", "x", "ch", "sh")) else "s")
    return f"{count} {plural}"


def short(value: float) -> str:
    """A float in four significant digits, for reprs: 0.75, 1.333, 0.08, 1e-05."""
    return f"{value:.4g}"


def sized(nbytes: float) -> str:
    """`nbytes` in the largest binary unit it fills: "23.5 GiB" (one decimal), "221 MiB",
    "3 KiB", "512 bytes"; a size under a MiB is never "0 MiB"."""
    for unit, scale, digits in (("GiB", 2**30, 1), ("MiB", 2**20, 0), ("KiB", 2**10, 0)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.{digits}f} {unit}"
    return counted(round(nbytes), "byte")


def suggest_keywords(target: F) -> F:
    """`target` (a function, or a class whose `__init__` is wrapped in place) raising TypeError
    with the closest accepted keywords for an unknown one."""
    if isinstance(target, type):
        init = vars(target)["__init__"]  # the class's own (decorate each class that has one)
        type.__setattr__(target, "__init__", _checked(init, target.__qualname__))
        return target
    return _checked(target, getattr(target, "__qualname__", repr(target)))  # type: ignore[return-value]


def unknown_keyword_message(name: str, keyword: str, accepted: list[str]) -> str:
    """Python's message for an unknown keyword of `name`, with what was probably meant."""
    close = difflib.get_close_matches(keyword, accepted, n=3, cutoff=0.6)
    if close:
        hint = "did you mean " + " or ".join(close) + "?"
    else:
        hint = "it accepts " + ", ".join(accepted)
    return f"{name}() got an unexpected keyword argument {keyword!r}: {hint}"


def _checked(function: Callable[..., Any], name: str) -> Callable[..., Any]:
    parameters = inspect.signature(function).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return function  # takes any keyword
    accepted = [p.name for p in parameters if p.kind in _NAMED and p.name != "self"]
    known = frozenset(accepted)

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        for keyword in kwargs:
            if keyword not in known:
                raise TypeError(unknown_keyword_message(name, keyword, accepted)) from None
        return function(*args, **kwargs)

    return call


def moved_keywords(moves: dict[str, str]) -> Callable[[F], F]:
    """A decorator for a class (its `__init__`): a call with a keyword of `moves`, one that was
    removed, raises TypeError naming its new spelling (`moves[keyword]`). Put it above
    `suggest_keywords`, so that a moved keyword is reported as moved, not as unknown."""

    def decorate(target: F) -> F:
        init = vars(target)["__init__"]
        name = getattr(target, "__qualname__", repr(target))

        @functools.wraps(init)
        def call(*args: Any, **kwargs: Any) -> Any:
            for keyword in kwargs:
                if keyword in moves:
                    raise TypeError(
                        f"{name}() no longer takes {keyword}=: pass {moves[keyword]} "
                        "(see CHANGELOG.md)"
                    ) from None
            return init(*args, **kwargs)

        type.__setattr__(target, "__init__", call)
        return target

    return decorate
