"""What every command's renderer shares: the output formats and text conversion helpers."""

from __future__ import annotations

import copy
import csv
import dataclasses
import io
import json
import math
import shutil
from collections.abc import Iterable, Mapping, Sequence
from contextvars import ContextVar
from enum import Enum
from typing import Any

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.control import strip_control_codes
from rich.measure import Measurement
from rich.segment import Segment
from rich.style import Style
from rich.table import Column, Row, Table
from rich.text import Text


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


#: Where tables go: the terminal's width (set by the CLI when stdout is a terminal), or None for
#: a pipe or a file, where every table keeps its natural width.
FIT_WIDTH: ContextVar[int | None] = ContextVar("softtopk_fit_width", default=None)
_NATURAL_MAX = 100_000
_PROSE = 30  # a cell with spaces and longer than this is prose: it may wrap between words


def terminal_width() -> int:
    """The terminal's width in columns (``COLUMNS`` wins, as in every Unix tool)."""
    return max(shutil.get_terminal_size((80, 24)).columns, 20)


def renderables_to_text(renderables: Sequence[RenderableType], *, color: bool, width: int | None = None) -> str:
    """Render rich objects to a string; plain text (no ANSI codes) when ``color`` is False.

    The one width policy of every command: with a target width (``width``, else
    :data:`FIT_WIDTH`: the terminal's) tables fit it without ever cutting a number, a name or a
    header: prose cells wrap between words, and a table still too wide is split into blocks of
    columns, each repeating the first (key) column. Without a target (a pipe, a file, a CI log)
    every renderable keeps its natural width. Rich markup is off: labels and file names are
    printed as they are, brackets included.
    """
    target = width if width is not None else FIT_WIDTH.get()
    console = Console(
        file=io.StringIO(),
        force_terminal=color,
        no_color=not color,
        color_system="auto" if color else None,
        width=target or _NATURAL_MAX,
        highlight=False,
        soft_wrap=False,
        markup=False,
        emoji=False,
    )
    with console.capture() as capture:
        for item in _flatten(renderables):
            parts = fit_table(item, console, target) if target is not None and isinstance(item, Table) else [item]
            for part in parts:
                if target is None:
                    part = _stacked(part, fitted=False)
                    console.width = max(min(_natural_width(console, part), _NATURAL_MAX), 1)
                elif isinstance(part, Table):  # a column wider than the terminal stays whole
                    console.width = max(target, _minimum_width(console, part))
                    part = _stacked(part, fitted=True)
                else:  # text wraps between words
                    console.width = target
                console.print(part)
    return capture.get()


def _flatten(renderables: Sequence[RenderableType]) -> list[RenderableType]:
    """The items of rich ``Group``s, so that every table is fitted on its own."""
    out: list[RenderableType] = []
    for item in renderables:
        if isinstance(item, Group):
            out.extend(_flatten(list(item.renderables)))
        else:
            out.append(item)
    return out


def _stacked(item: RenderableType, *, fitted: bool) -> RenderableType:
    """``item``, a table of one-line text rows, as one row of stacked cells: the same text.

    Rich measures and renders every cell on its own, the bulk of a long table's time; a column
    of lines costs one cell. Only where no cell can wrap, so every row stays one line high:
    one-line cells (``str``, or ``Text`` with one style and no settings of its own), no row
    styles, separators or footer, no width limits; under a target width, no prose column
    (only prose wraps there).
    """
    if not isinstance(item, Table) or item.row_count < 2:
        return item
    if item.row_styles or item.show_lines or item.leading or item.show_footer or item.highlight:
        return item
    if any(row.style or row.end_section for row in item.rows):
        return item
    for column in item.columns:
        if column.width is not None or column.max_width is not None or column.ratio or column.highlight:
            return item
        if fitted and not column.no_wrap:  # fit_table's prose column: its cells may wrap
            return item
        if not all(_one_line(cell) for cell in column.cells):
            return item
    stacked = copy.copy(item)
    stacked.columns = [
        dataclasses.replace(c, _cells=[_StackedCells(list(c.cells))]) for c in item.columns  # type: ignore[arg-type]
    ]
    stacked.rows = [Row()]
    return stacked


def _one_line(cell: RenderableType) -> bool:
    if type(cell) is Text:
        settings = (cell.justify, cell.overflow, cell.no_wrap, cell.tab_size, cell.spans, cell.end)
        if settings != (None, None, None, None, [], "\n"):
            return False
    elif type(cell) is not str:
        return False
    plain = _plain(cell)
    return "\t" not in plain and plain.splitlines() in ([], [plain])


def _plain(cell: str | Text) -> str:
    """The characters rich prints of a text cell (it drops control codes such as carriage returns)."""
    return cell.plain if isinstance(cell, Text) else strip_control_codes(cell)


class _StackedCells:
    """One-line cells (one per row) rendered as one cell, line for line as rich renders each.

    Per line, as rich's ``Text.wrap`` does for a line that fits its width: no change under
    ``overflow="ignore"``; else justified right or centre (after stripping trailing spaces) or
    left, the padding in the line's style.
    """

    def __init__(self, cells: list[str | Text]) -> None:
        self._lines = [(_plain(c), c.style if isinstance(c, Text) else "") for c in cells]
        widths = [cell_len(line) for line, _ in self._lines]
        words = [max((cell_len(w) for w in line.split()), default=n) for (line, _), n in zip(self._lines, widths, strict=True)]
        self._measurement = Measurement(max(words, default=0), max(widths, default=0))

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return self._measurement.with_maximum(options.max_width)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        justify = None if options.overflow == "ignore" else options.justify
        newline = Segment("\n")
        for line, style in self._lines:
            if justify in ("right", "center"):
                line = line.rstrip()
                spare = width - cell_len(line)
                left = spare if justify == "right" else spare // 2
                line = " " * left + line + " " * (spare - left)
            elif justify == "left":
                line += " " * (width - cell_len(line))
            if line:
                yield Segment(line, console.get_style(style, default=Style.null()) if style else None)
            yield newline


def _cell_width(console: Console, cell: RenderableType) -> int:
    if type(cell) in (str, Text):  # what rich measures of text, without building and measuring a Text
        lines = _plain(cell).splitlines()  # type: ignore[arg-type]
        return min(max((cell_len(line) for line in lines), default=0), _NATURAL_MAX)
    return Measurement.get(console, console.options.update(width=_NATURAL_MAX), cell).maximum


def _natural_width(console: Console, item: RenderableType) -> int:
    return Measurement.get(console, console.options.update(width=_NATURAL_MAX), item).maximum


def _is_prose(console: Console, cells: Sequence[RenderableType]) -> bool:
    return any(" " in str(cell) and _cell_width(console, cell) > _PROSE for cell in cells)


def _column_need(console: Console, column: Column) -> int:
    """Columns a table column needs: all of an atomic column, the longest word of prose."""
    cells = [column.header, *column.cells]
    if _is_prose(console, list(column.cells)):
        words = [len(word) for cell in cells for word in str(cell).split()]
        return max([_PROSE, *words]) if words else _PROSE
    return max((_cell_width(console, cell) for cell in cells), default=1)


def _minimum_width(console: Console, item: RenderableType) -> int:
    if not isinstance(item, Table):
        return _natural_width(console, item)
    return _table_width(item, [_column_need(console, c) for c in item.columns])


def _table_width(table: Table, needs: Sequence[int]) -> int:
    left, right = table.padding[3], table.padding[1]
    borders = (len(needs) + 1) if table.box is not None else 0
    edge = 0 if table.pad_edge else -(left + right)
    return sum(needs) + len(needs) * (left + right) + borders + edge


def fit_table(table: Table, console: Console, width: int) -> list[Table]:
    """``table`` made to fit ``width`` columns without cutting a number, a name or a header.

    Atomic columns (numbers, names) never wrap; prose columns wrap between words. When the
    atomic columns alone do not fit, the table is split into blocks of columns, each block
    repeating the first column (the row's key). A single column wider than ``width`` is left
    whole (the line is then longer than the terminal, never cut).
    """
    for column in table.columns:
        if _is_prose(console, list(column.cells)):
            column.overflow = "fold"
        else:
            column.no_wrap = True
            column.overflow = "ignore"
            column.min_width = _column_need(console, column)
    needs = [_column_need(console, c) for c in table.columns]
    if _table_width(table, needs) <= width or len(table.columns) <= 2:
        return [table]
    blocks: list[list[int]] = []
    current: list[int] = []
    for index in range(1, len(table.columns)):
        trial = [0, *current, index]
        if current and _table_width(table, [needs[i] for i in trial]) > width:
            blocks.append(current)
            current = [index]
        else:
            current.append(index)
    blocks.append(current)
    parts = []
    for number, block in enumerate(blocks):
        part = copy.copy(table)
        part.columns = [copy.copy(table.columns[i]) for i in (0, *block)]
        if number:
            part.title = f"{table.title} (continued: columns {number + 1}/{len(blocks)})" if table.title else None
        elif len(blocks) > 1 and table.title:
            part.title = f"{table.title} (columns 1/{len(blocks)})"
        parts.append(part)
    return parts


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
