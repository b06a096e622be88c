"""Plots: one style per method (distinct colour and marker), stable across commands, no empty panels."""

from __future__ import annotations

import colorsys
import itertools

import pytest

import topk_cli as st
from topk_cli.analysis.sweep import temperature_sweep
from topk_cli.render.styles import method_style, method_styles, registered_styles

pytest.importorskip("matplotlib")


def _hue(color: str) -> float:
    r, g, b = (int(color[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return colorsys.rgb_to_hls(r, g, b)[0]


def test_every_registered_method_has_its_own_colour_and_marker() -> None:
    assert set(st.METHODS) <= set(registered_styles())
    styles = [method_style(m) for m in st.METHODS]
    assert len({s.color for s in styles}) == len(styles)
    assert len({(s.color, s.marker) for s in styles}) == len(styles)
    # the pairs users could not tell apart with matplotlib's 10-colour cycle
    for a, b in (("hard", "ot-sinkhorn"), ("iterative", "perturbed"), ("weighted-softmax", "topk-softmax")):
        assert method_style(a).color != method_style(b).color and method_style(a).marker != method_style(b).marker


def test_families_share_a_hue() -> None:
    by_family: dict[str, list[float]] = {}
    for name, spec in st.METHODS.items():
        if spec.family != "baseline":
            by_family.setdefault(spec.family, []).append(_hue(method_style(name).color))
    spreads = [max(h) - min(h) for h in by_family.values() if len(h) > 1]
    assert len(spreads) >= 3 and max(spreads) < 0.3  # threshold: greens, gradient: blues, iterative: oranges
    # and no family's hues reach into another's
    bands = sorted((min(h), max(h)) for h in by_family.values())
    assert all(a[1] < b[0] for a, b in itertools.pairwise(bands)), bands


def test_unknown_names_get_deterministic_distinct_styles() -> None:
    names = [f"mine.py:op{i}" for i in range(20)]
    first, again = method_styles(names), method_styles(names)
    assert first == again and method_style("mine.py:op3") == method_style("mine.py:op3")
    builtin = {(s.color, s.marker) for s in registered_styles().values()}
    pairs = [(s.color, s.marker) for s in first.values()]
    assert len(set(pairs)) == len(pairs) and not set(pairs) & builtin


def _assert_no_empty_axes(fig) -> None:
    assert fig.axes
    for ax in fig.axes:
        assert ax.axison, ax.get_title()
        assert ax.lines, f"empty panel: {ax.get_title()!r}"


def test_sweep_plot_styles_marks_and_no_empty_panels() -> None:
    from topk_cli.render.sweep import sweep_figure

    r = temperature_sweep([3.0, 2.0, 1.5, 1.0, 0.0, -1.0], 2, taus="1e-3:1e3:7", match=0.9, hardness=0.8)
    fig = sweep_figure(r)
    _assert_no_empty_axes(fig)
    labels = [line.get_label() for ax in fig.axes for line in ax.lines]
    assert "hard" not in labels  # constant in tau: not drawn, named in the title instead
    assert "hard" in fig.get_suptitle()
    for m in ("grad", "ot-sinkhorn", "perturbed"):
        line = next(ln for ln in fig.axes[1].lines if ln.get_label() == m)
        assert (line.get_color(), line.get_marker()) == (method_style(m).color, method_style(m).marker)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "at top-k mass 0.8" in legend and "tau of top-k mass 0.9" in legend
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any("exact 0" in t for t in texts)  # the floor where zeros are drawn is labelled


def test_sweep_plot_of_hard_alone_has_no_empty_axes() -> None:
    from topk_cli.render.sweep import sweep_figure

    fig = sweep_figure(temperature_sweep([3.0, 2.0, 1.0], 1, methods=["hard"], taus=[0.1, 1.0]))
    assert not fig.axes and "change" in fig.texts[0].get_text()


def test_train_probe_plot_without_gradient_check_has_no_empty_panel() -> None:
    from topk_cli.analysis.train_probe import probe_config, train_probe
    from topk_cli.render.train_probe import train_probe_figure

    config = probe_config(
        tasks=None, methods=["grad", "thre-sigmoid", "hard"], hardness=None, taus=(), seeds=2, steps=6,
        quick=True, grad_check=None,
    )
    result = train_probe(config)
    fig = train_probe_figure(result)
    _assert_no_empty_axes(fig)
    assert len(fig.axes) == len(result.config.tasks)
    colors = {ln.get_label().split(" ")[0]: ln.get_color() for ln in fig.axes[0].lines if "(" in ln.get_label()}
    assert colors["grad"] == method_style("grad").color and colors["thre-sigmoid"] == method_style("thre-sigmoid").color
