"""Output: rich tables for people, JSON for scripts, progress bars on stderr.

Every command builds plain data (dicts, lists) first and hands it here, so the JSON form and
the table form always show the same facts.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from eoguard.cli.context import CliContext


def console() -> Console:
    """A console on the current stdout (so click's test runner captures it); wide off a tty."""
    out = Console(file=sys.stdout, highlight=False, soft_wrap=False)
    if not out.is_terminal:
        out = Console(file=sys.stdout, highlight=False, width=max(out.width, 160))
    return out


def err_console() -> Console:
    """Progress and event lines on stderr; off a terminal they never wrap."""
    return Console(file=sys.stderr, highlight=False, soft_wrap=True)


def emit_json(data: Any) -> None:
    """Print ``data`` as JSON on stdout."""
    click.echo(json.dumps(data, indent=2, default=str))


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    """A rich table; numbers right-aligned, None shown as ``-``."""
    rows = [list(r) for r in rows]
    out = Table(title=title, title_justify="left", show_lines=False)
    for i, name in enumerate(columns):
        numeric = bool(rows) and all(
            r[i] is None or (isinstance(r[i], (int, float)) and not isinstance(r[i], bool)) for r in rows)
        out.add_column(name, justify="right" if numeric else "left", overflow="fold")
    for row in rows:
        out.add_row(*(cell(v) for v in row))
    return out


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str)
    return str(value)


def key_values(title: str | None, pairs: Mapping[str, Any]) -> Table:
    """A two-column field/value table."""
    out = Table(title=title, title_justify="left", show_header=False)
    out.add_column("field", style="bold")
    out.add_column("value", overflow="fold")
    for name, value in pairs.items():
        out.add_row(name, cell(value))
    return out


def show(cli: CliContext, data: Any, *renderables: Any) -> None:
    """JSON of ``data`` with ``--json``; the rich renderables otherwise."""
    if cli.as_json:
        emit_json(data)
        return
    out = console()
    for item in renderables:
        out.print(item)


def progress(cli: CliContext) -> Progress:
    """A progress display on stderr; silent with --json or off a terminal."""
    err = err_console()
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                    MofNCompleteColumn(), TimeElapsedColumn(), console=err, transient=True,
                    disable=cli.as_json or not err.is_terminal)


def iso_ms(epoch_ms: int | None) -> str | None:
    """Epoch milliseconds as an ISO-8601 UTC string (None stays None)."""
    if epoch_ms is None or epoch_ms < 0:
        return None
    return datetime.fromtimestamp(epoch_ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")


def duration_ms(ms: int | float | None) -> str | None:
    """A short human duration: 850ms, 12.3s, 4m05s, 2h10m, 3d04h."""
    if ms is None:
        return None
    sign = "-" if ms < 0 else ""
    ms = abs(ms)
    if ms < 1000:
        return f"{sign}{ms:.0f}ms"
    s = ms / 1000
    if s < 60:
        return f"{sign}{s:.1f}s"
    m, s = divmod(int(s), 60)
    if m < 60:
        return f"{sign}{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{sign}{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{sign}{d}d{h:02d}h"
