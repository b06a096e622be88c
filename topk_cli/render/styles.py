"""One plot style per method (colour, marker, line style), the same in every command's plot.

Families share a hue (blues for the gradient family, greens for the threshold family, ...), so a
plot reads by family first; within a family every member has its own shade, marker and line
style, so no two registered methods look alike even in greyscale. A name not in the table (a
user's operator, ``FILE.py:FUNCTION``) gets a deterministic style from a separate palette,
chosen from a hash of its name and drawn dashed, so it never takes a built-in method's look.

No matplotlib here: styles are plain strings that matplotlib understands.
"""

from __future__ import annotations

import functools
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


#: Per family (the registry's ``family``), the looks of its members in registry order: one hue
#: per family (black baseline, blue gradient, orange/brown iterative, green threshold, purple
#: optimal transport, red Monte Carlo, magenta pseudo-smooth, gold sigmoid, cyan scaled softmax, indigo
#: surrogate gradient, brown relaxed sorting), a shade, marker and line style each.
FAMILY_STYLES: dict[str, tuple[PlotStyle, ...]] = {
    "baseline": (PlotStyle("#000000", "s", ":"), PlotStyle("#404040", "D", "--")),
    "gradient": (PlotStyle("#1f4e9c", "o"), PlotStyle("#5fa8e8", "v", "--"), PlotStyle("#08306b", "<", "-.")),
    "iterative": (PlotStyle("#d95f02", "D"), PlotStyle("#8c4a12", "^", "--"), PlotStyle("#f5a04a", ">", "-.")),
    "threshold": (
        PlotStyle("#00441b", "o"), PlotStyle("#1b7837", "s", "--"), PlotStyle("#5aae61", "^", "-."),
        PlotStyle("#2ab0a0", "P", ":"), PlotStyle("#9bc53d", "X", (0, (5, 1, 1, 1))),
        PlotStyle("#006d2c", "v", (0, (3, 1, 1, 1, 1, 1))),
    ),
    "optimal-transport": (PlotStyle("#6a3d9a", "h"), PlotStyle("#9e7cc1", "H", "--")),
    "perturbed": (PlotStyle("#d62728", "*", "--"), PlotStyle("#f08080", "x", "-.")),
    "pseudo-smooth": (PlotStyle("#e7298a", "p", "-."), PlotStyle("#c51b7d", "h", ":")),
    "sigmoid": (PlotStyle("#b8860b", "d", "-."), PlotStyle("#e6ab02", "P", ":")),
    "scaled-softmax": (PlotStyle("#0097a7", "o", "--"),),
    "surrogate-gradient": (PlotStyle("#3949ab", "s", "-."),),
    "relaxed-sort": (PlotStyle("#8d6e63", "d"), PlotStyle("#5d4037", "8", "--"), PlotStyle("#a1887f", "*", "-.")),
}


@functools.cache
def registered_styles() -> dict[str, PlotStyle]:
    """The style of every registered method: its family's looks, taken in registry order.

    Derived from the registry (asked on first use: plots import this module, ``--help`` does not),
    so a new method gets its family's next look without an edit here.
    """
    from topk_cli.registry import METHODS

    out: dict[str, PlotStyle] = {}
    taken: dict[str, int] = {}
    for name, spec in METHODS.items():
        looks = FAMILY_STYLES.get(spec.family, ())
        i = taken.get(spec.family, 0)
        taken[spec.family] = i + 1
        if i < len(looks):
            out[name] = looks[i]
    return out


#: Styles for names not in the table: hues no family uses, drawn dashed.
_EXTRA_COLORS = ("#7f7f7f", "#bcbd22", "#17becf", "#a6761d", "#666666", "#b15928", "#fb9a99", "#cab2d6")
_EXTRA_MARKERS = ("d", "<", ">", "8", "H", "1", "2", "+")


def method_style(name: str) -> PlotStyle:
    """The style of ``name``: its own for a registered method, else a deterministic extra one.

    >>> method_style("mine.py:topk") == method_style("mine.py:topk")
    True
    """
    registered = registered_styles()
    if name in registered:
        return registered[name]
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
    registered = registered_styles()
    used = {(s.color, s.marker) for s in registered.values()}
    for name in dict.fromkeys(names):
        if name in registered:
            out[name] = registered[name]
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
