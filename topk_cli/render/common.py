"""What every command's renderer shares: the output formats and text conversion helpers."""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
from collections.abc import Iterable, Mapping, Sequence
from enum import Enum
from typing import Any

from rich.console import Console, RenderableType


class OutputFormat(str, Enum):
    """``--format`` choices shared by every command."""

    table = "table"
    csv = "csv"
    json = "json"


def jsonable(value: Any) -> Any:
    """Convert numpy scalars/arrays and non-finite floats into strict-JSON values (NaN/inf -> null)."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return jsonable(value.tolist())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return value


def render_json(document: Mapping[str, Any]) -> str:
    """One strict JSON document (no NaN tokens), newline-terminated."""
    return json.dumps(jsonable(document), indent=2, allow_nan=False) + "\n"


def render_csv(rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """Tidy CSV text with a header; floats written with repr precision, None as empty."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({key: _csv_cell(row.get(key)) for key in columns})
    return buffer.getvalue()


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ("nan" if math.isnan(value) else repr(value))
    return value


def renderables_to_text(renderables: Sequence[RenderableType], *, color: bool, width: int | None = None) -> str:
    """Render rich objects to a string; plain text (no ANSI codes) when ``color`` is False.

    With colour (a terminal) tables fit ``width`` (default: the terminal's). Without colour the
    text goes to a pipe, a file or a CI log, where nothing should be cut: the width grows to
    the widest renderable's natural width (up to 1000 columns).
    """
    console = Console(
        file=io.StringIO(),
        force_terminal=color,
        no_color=not color,
        color_system="auto" if color else None,
        width=width or (shutil.get_terminal_size((120, 24)).columns if color else 1000),
        highlight=False,
        soft_wrap=False,
    )
    if not color:
        natural = max((console.measure(item).maximum for item in renderables), default=80)
        console.width = min(max(natural, width or 80), 1000)
    with console.capture() as capture:
        for item in renderables:
            console.print(item)
    return capture.get()


def format_float(value: float, digits: int = 6) -> str:
    """Compact fixed/scientific formatting for tables (``nan`` and ``inf`` spelled out)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0:
        return "0"
    magnitude = abs(value)
    if 1e-4 <= magnitude < 1e6:
        return f"{value:.{digits}f}".rstrip("0").rstrip(".") if digits else f"{value:.0f}"
    return f"{value:.{max(digits - 3, 2)}e}"


class ProgressReporter:
    """A progress bar on stderr for long runs, shown only when stderr is a terminal.

    Use as a context manager; call the instance with ``(done, total)`` from the analysis's
    ``progress`` callback. When disabled it does nothing, so callers need no branches.
    """

    def __init__(self, description: str, *, enabled: bool) -> None:
        self._description = description
        self._enabled = enabled
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> ProgressReporter:
        if self._enabled:
            from rich.progress import Progress

            self._progress = Progress(console=Console(stderr=True), transient=True)
            self._progress.__enter__()
            self._task = self._progress.add_task(self._description, total=None)
        return self

    def __call__(self, done: int, total: int) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=done, total=total)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)
