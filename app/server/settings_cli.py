"""The settings as a user meets them: a `python -m app serve` flag for every
setting, and the settings table of docs/settings.md — both generated from
`app.server.settings.SETTINGS`, like the environment reader.

Flags are passed on as values (`read_settings(env, flags)`), never written
into `os.environ`: the process's environment stays what its parent gave it.

    python -m app.server.settings_cli                    # print the table
    python -m app.server.settings_cli --write docs/settings.md  # rewrite it in place
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from app.server.settings import SETTINGS, Setting

TABLE_START = "<!-- settings-table:start -->"
TABLE_END = "<!-- settings-table:end -->"


# ------------------------------------------------------------------ flags


def add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per setting (MAX_QUEUE → `--max-queue`), stored under the
    setting's attribute name as the text given (None when not given): the
    setting's parser checks it, as it checks the environment variable."""
    group = parser.add_argument_group(
        "settings", "each can also be set by its environment variable; the flag wins"
    )
    for setting in SETTINGS:
        group.add_argument(
            setting.flag,
            *setting.aliases,
            dest=setting.name,
            metavar=setting.parser.metavar,
            default=None,
            help=_flag_help(setting),
        )


def flag_values(args: argparse.Namespace) -> dict[str, str]:
    """The settings given as flags: attribute name → text."""
    return {
        setting.name: getattr(args, setting.name)
        for setting in SETTINGS
        if getattr(args, setting.name) is not None
    }


def _flag_help(setting: Setting) -> str:
    text = (
        f"{_plain(setting.meaning)} [{setting.parser.describe()}; "
        f"default {_plain(setting.shown())}; env {setting.env}]"
    )
    return text.replace("%", "%%")  # argparse formats help with %


def _plain(markdown: str) -> str:
    return markdown.replace("`", "")


# ------------------------------------------------------------------ the settings table


def markdown_table() -> str:
    rows = ["| variable | flag | default | meaning |", "|---|---|---|---|"]
    for setting in SETTINGS:
        flags = ", ".join(f"`{flag}`" for flag in (setting.flag, *setting.aliases))
        rows.append(
            f"| `{setting.env}` | {flags} | {_cell(setting.shown())} | {_cell(setting.meaning)} |"
        )
    return "\n".join(rows) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _table_span(document: str) -> tuple[int, int]:
    start = document.find(TABLE_START)
    end = document.find(TABLE_END)
    if start < 0 or end < start:
        raise ValueError(f"no {TABLE_START} … {TABLE_END} markers in order")
    return start + len(TABLE_START), end


def table_in(document: str) -> str:
    """The settings table between the markers of a document (docs/settings.md)."""
    start, end = _table_span(document)
    return document[start:end].strip("\n") + "\n"


def with_table(document: str) -> str:
    """`document` with the current table between its markers."""
    start, end = _table_span(document)
    return f"{document[:start]}\n\n{markdown_table()}\n{document[end:]}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m app.server.settings_cli",
        description="Print the settings table, or rewrite it in a Markdown file.",
    )
    parser.add_argument(
        "--write",
        type=Path,
        metavar="FILE",
        help=f"replace the table between {TABLE_START} and {TABLE_END} in FILE",
    )
    args = parser.parse_args(argv)
    if args.write is None:
        sys.stdout.write(markdown_table())
        return 0
    document = args.write.read_text(encoding="utf-8")
    args.write.write_text(with_table(document), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
