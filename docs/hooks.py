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


def cli_help_markdown() -> str:
    """Markdown for the help of `prefetch` and of each subcommand, in registration order."""
    from prefetch.cli import build_parser

    parser = build_parser()
    parts = ["## `prefetch`", "", "```text", _help(parser).rstrip(), "```"]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, subparser in action.choices.items():
                parts += ["", f"## `prefetch {name}`", "", "```text", _help(subparser).rstrip()]
                parts += ["```"]
    return "\n".join(parts) + "\n"


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, cli_help_markdown())
