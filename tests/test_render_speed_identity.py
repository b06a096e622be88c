"""Tables of one-line rows are rendered as stacked columns (one cell per column): same bytes as rich.

The reference is rich's own path, one cell per (row, column), which the stacking bypasses:
every case is rendered both ways, in colour and plain, at natural width and fitted to widths.
"""

from __future__ import annotations

import pytest
from rich.console import Group, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from topk_cli.analysis.probe import stability_probe
from topk_cli.render import common
from topk_cli.render.common import FIT_WIDTH, OutputFormat, renderables_to_text
from topk_cli.render.probe import render_probe, render_probe_table

WIDTHS = (None, 24, 60, 100, 200)


def _per_cell(monkeypatch: pytest.MonkeyPatch) -> None:
    """rich's own path: no stacking, every cell measured by rich."""
    monkeypatch.setattr(common, "_stacked", lambda item, fitted: item)
    monkeypatch.setattr(
        common, "_cell_width",
        lambda console, cell: Measurement.get(console, console.options.update(width=common._NATURAL_MAX), cell).maximum,
    )


def _tables() -> list[RenderableType]:
    styled = Table(box=None, pad_edge=False)
    styled.add_column("key", justify="right")
    styled.add_column("long\nheader", justify="right")
    styled.add_column("centre", justify="center")
    styled.add_column("left")
    for i, style in enumerate(("green", "bold red", "", "yellow", "dark_orange")):
        styled.add_row(
            f"{10.0 ** i:.3g}", Text(f"░░{i:>3d}", style=style), Text("x" * i + "  ", style=style or "blue"),
            "" if i == 2 else Text(f"v {i}" * i, style="cyan") if i % 2 else f"v\r {i}\a ",  # rich drops \r, \a
        )
    boxed = Table(title="A boxed table with a title wider than the table itself", title_justify="left")
    for name in ("method", "n", "words with spaces in a rather long cell"):
        boxed.add_column(name, justify="left" if name == "method" else "right")
    for i in range(6):
        boxed.add_row(f"name-{i}", str(10 ** i), " ".join(["word"] * (i * 3)) or "-")
    boxed.caption = "a caption"
    return [Text("heading\nsecond line"), styled, Group(Text("\ntitle", style="bold"), boxed)]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("color", [False, True])
def test_stacked_tables_match_rich(monkeypatch: pytest.MonkeyPatch, color: bool, width: int | None) -> None:
    fast = renderables_to_text(_tables(), color=color, width=width)
    _per_cell(monkeypatch)
    assert fast == renderables_to_text(_tables(), color=color, width=width)


def test_stacking_is_taken_and_refused_where_it_must_be() -> None:
    styled, boxed = _tables()[1], _tables()[2].renderables[1]  # type: ignore[union-attr]
    for table, fitted, stacks in ((styled, False, True), (boxed, False, True)):
        assert isinstance(table, Table)
        out = common._stacked(table, fitted=fitted)
        assert isinstance(out, Table) and (out.row_count == 1) == stacks
    sectioned = Table()
    sectioned.add_column("a")
    sectioned.add_row("1", end_section=True)
    sectioned.add_row("2")
    assert common._stacked(sectioned, fitted=False) is sectioned
    for two_lines in ("1\n2", "1\n", "1\u20282", Text("1\n2"), Text("1", justify="right")):
        table = Table()
        table.add_column("a")
        table.add_row(two_lines)
        table.add_row("3")
        assert common._stacked(table, fitted=False) is table


@pytest.fixture(scope="module")
def report():  # type: ignore[no-untyped-def]
    return stability_probe(
        methods=("grad-recursive", "thre-exp"), ns=(10, 40), ks=(1, 3, "0.5n"), scales=(0.1, 30.0, 300.0), trials=3,
    )


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("color", [False, True])
def test_probe_table_matches_rich(monkeypatch: pytest.MonkeyPatch, report, color: bool, width: int | None) -> None:  # type: ignore[no-untyped-def]
    tables = [t for t in common._flatten(render_probe_table(report)) if isinstance(t, Table)]
    assert all(common._stacked(t, fitted=False).row_count == 1 for t in tables)  # the fast path is taken
    token = FIT_WIDTH.set(width)
    try:
        fast = render_probe(report, OutputFormat.table, color=color)
        _per_cell(monkeypatch)
        slow = render_probe(report, OutputFormat.table, color=color)
    finally:
        FIT_WIDTH.reset(token)
    assert fast == slow
