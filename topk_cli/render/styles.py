"""One plot style per method (colour, marker, line style), the same in every command's plot.

Families share a hue (blues for the gradient family, greens for the threshold family, ...), so a
plot reads by family first; within a family every member has its own shade, marker and line
style, so no two registered methods look alike even in greyscale. A name not in the table (a
user's operator, ``FILE.py:FUNCTION``) gets a deterministic style from a separate palette,
chosen from a hash of its name and drawn dashed, so it never takes a built-in method's look.

No matplotlib here: styles are plain strings that matplotlib understands.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Union

#: A matplotlib line style: a name (``"-"``, ``"--"``, ``"-."``, ``":"``) or ``(offset, dashes)``.
LineStyle = Union[str, tuple[int, tuple[int, ...]]]


@dataclass(frozen=True)
class PlotStyle:
    """How one method is drawn: a colour (``#rrggbb``), a marker and a line style."""

    color: str
    marker: str
    linestyle: LineStyle = "-"

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``Axes.plot``."""
        return {"color": self.color, "marker": self.marker, "linestyle": self.linestyle}


#: The registered methods, grouped by family (hue), each with its own colour and marker.
METHOD_STYLES: dict[str, PlotStyle] = {
    # baseline: black
    "hard": PlotStyle("#000000", "s", ":"),
    # gradient family (softmax-based): blues
    "grad": PlotStyle("#1f4e9c", "o"),
    "grad-recursive": PlotStyle("#5fa8e8", "v", "--"),
    # iterative family: oranges / browns
    "iterative": PlotStyle("#d95f02", "D"),
    "weighted-softmax": PlotStyle("#8c4a12", "^", "--"),
    # threshold family: greens
    "thre-exp": PlotStyle("#00441b", "o"),
    "thre-sigmoid": PlotStyle("#1b7837", "s", "--"),
    "thre-laplace": PlotStyle("#5aae61", "^", "-."),
    "thre-clip": PlotStyle("#2ab0a0", "P", ":"),
    "thre-cube": PlotStyle("#9bc53d", "X", (0, (5, 1, 1, 1))),
    # optimal transport: purple
    "ot-sinkhorn": PlotStyle("#6a3d9a", "h"),
    # perturbed (Monte Carlo): red
    "perturbed": PlotStyle("#d62728", "*", "--"),
    # pseudo-smooth: magenta
    "topk-softmax": PlotStyle("#e7298a", "p", "-."),
}

#: Styles for names not in the table: hues no family uses, drawn dashed.
_EXTRA_COLORS = ("#7f7f7f", "#bcbd22", "#17becf", "#a6761d", "#666666", "#b15928", "#fb9a99", "#cab2d6")
_EXTRA_MARKERS = ("d", "<", ">", "8", "H", "1", "2", "+")


def method_style(name: str) -> PlotStyle:
    """The style of ``name``: its own for a registered method, else a deterministic extra one.

    >>> method_style("grad").color
    '#1f4e9c'
    >>> method_style("mine.py:topk") == method_style("mine.py:topk")
    True
    """
    if name in METHOD_STYLES:
        return METHOD_STYLES[name]
    return _extra(zlib.crc32(name.encode("utf-8")))


def _extra(code: int) -> PlotStyle:
    color = _EXTRA_COLORS[code % len(_EXTRA_COLORS)]
    marker = _EXTRA_MARKERS[(code // len(_EXTRA_COLORS)) % len(_EXTRA_MARKERS)]
    return PlotStyle(color, marker, "--")


def method_styles(names: Iterable[str]) -> dict[str, PlotStyle]:
    """A style per name, no two alike: extra names that collide take the next free extra style.

    Deterministic for a given list of names (registered methods always keep their own style).
    """
    out: dict[str, PlotStyle] = {}
    used = {(s.color, s.marker) for s in METHOD_STYLES.values()}
    for name in dict.fromkeys(names):
        if name in METHOD_STYLES:
            out[name] = METHOD_STYLES[name]
            continue
        code = zlib.crc32(name.encode("utf-8"))
        style = _extra(code)
        for step in range(len(_EXTRA_COLORS) * len(_EXTRA_MARKERS)):
            style = _extra(code + step)
            if (style.color, style.marker) not in used:
                break
        used.add((style.color, style.marker))
        out[name] = style
    return out
