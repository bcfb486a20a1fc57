"""MkDocs hook (mkdocs.yml `hooks:`): the `prefetch` command's help, generated at build time.

A page line `<!-- prefetch-cli-help -->` becomes the `--help` text of `prefetch` and of each of
its subcommands, taken from `prefetch.cli.build_parser()`, so the CLI reference cannot drift
from the parser. A new subcommand appears without editing the page.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

MARKER = "<!-- prefetch-cli-help -->"
# Help is wrapped to this many columns (argparse reads $COLUMNS), the same on every machine.
HELP_COLUMNS = 88


def _help(parser: argparse.ArgumentParser) -> str:
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(HELP_COLUMNS)
    try:
        return parser.format_help()
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def _sections(parser: argparse.ArgumentParser, command: str, level: int, below: int) -> list[str]:
    """The help of `command` under a heading of `level`, then that of each of its
    subcommands under headings of level `below` (and theirs one level further down: `prefetch
    shards write`), in registration order."""
    parts = [f"{'#' * level} `{command}`", "", "```text", _help(parser).rstrip(), "```"]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, subparser in action.choices.items():
                deeper = min(below + 1, 6)
                parts += ["", *_sections(subparser, f"{command} {name}", below, deeper)]
    return parts


def cli_help_markdown() -> str:
    """Markdown for the help of `prefetch` and of each subcommand, at every depth: `prefetch`
    and its commands as sections, their own subcommands as subsections."""
    from prefetch.cli import build_parser

    return "\n".join(_sections(build_parser(), "prefetch", 2, 2)) + "\n"


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, cli_help_markdown())
