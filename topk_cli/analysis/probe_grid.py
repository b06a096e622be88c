"""The grid of ``stability-probe``: parsing its axes, drawing its inputs, bounding its memory.

Draws are keyed by ``(seed, n, dist)``, so a cell's inputs do not depend on which other cells are
in the grid nor on the order the grid's units run in.

Axis convention: the last axis holds the ``n`` scores; leading axes are a batch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from topk_cli.api import get_method
from topk_cli.errors import InvalidArgumentError
from topk_cli.operators._base import FloatArray

#: Input distributions, each standardised to mean 0 (median 0) and unit variance.
DISTRIBUTIONS = ("normal", "uniform", "laplace", "student-t")

_SQRT3 = math.sqrt(3.0)


# ---------------------------------------------------------------------------------------------
# grid parsing


def parse_scales(spec: str) -> tuple[float, ...]:
    """Scales from ``"lo:hi:count"`` (log-spaced, both ends included) or ``"a,b,c"``.

    Raises:
        InvalidArgumentError: malformed spec, non-positive or non-finite scales.

    >>> parse_scales("0.1:1000:5")
    (0.1, 1.0, 10.0, 100.0, 1000.0)
    """
    text = spec.strip()
    try:
        if ":" in text:
            parts = text.split(":")
            if len(parts) != 3:
                raise ValueError
            lo, hi, count = float(parts[0]), float(parts[1]), int(parts[2])
            if not (lo > 0 and hi >= lo and count >= 1 and math.isfinite(hi)):
                raise ValueError
            if count == 1:
                return (lo,)
            grid = np.logspace(math.log10(lo), math.log10(hi), count)
            values = tuple(float(f"{v:.12g}") for v in grid)
        else:
            values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise InvalidArgumentError(
            f"scales must be 'lo:hi:count' (log-spaced, 0 < lo <= hi, count >= 1) or a list like "
            f"'0.1,1,10', got {spec!r}"
        ) from None
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise InvalidArgumentError(f"scales must be finite and > 0, got {spec!r}")
    return tuple(sorted(set(values)))


def resolve_k(spec: str, n: int) -> int | float | None:
    """``k`` for length ``n`` from ``"5"``, a real ``"2.5"`` (for the methods that take a real k)
    or a fraction of n ``"0.1n"``; None when k > n.

    A fraction gives ``max(1, round(f * n))``; an integral real (``"2.0"``) is the integer.

    Raises:
        InvalidArgumentError: not a number > 0 or a fraction in (0, 1] followed by ``n``.

    >>> resolve_k("0.1n", 100), resolve_k("5", 3), resolve_k("1n", 7), resolve_k("2.5", 10)
    (10, None, 7, 2.5)
    """
    text = spec.strip().lower()
    try:
        if text.endswith("n"):
            frac = float(text[:-1]) if text[:-1] else 1.0
            if not 0 < frac <= 1:
                raise ValueError
            return max(1, round(frac * n))
        number = float(text)
        if not (math.isfinite(number) and number > 0) or "_" in text:
            raise ValueError
        value: int | float = int(number) if number.is_integer() else number
        if isinstance(value, int) and value < 1:
            raise ValueError
    except ValueError:
        raise InvalidArgumentError(
            f"k must be a number > 0 (an integer, or a real k for the methods that take one) or a fraction of n "
            f"like '0.1n' (0 < fraction <= 1), got {spec!r}"
        ) from None
    return value if value <= n else None


def draw_scores(n: int, trials: int, *, dist: str, seed: int) -> FloatArray:
    """Standardised draws ``(trials, n)`` for length ``n``: the same for every k and scale.

    The generator is keyed by ``(seed, n, dist)`` (``SeedSequence`` spawn key), so a cell's
    draws do not depend on which other cells are in the grid. ``student-t`` has 3 degrees of
    freedom (heavy tails), scaled to unit variance like the others.

    Raises:
        InvalidArgumentError: unknown ``dist``.

    >>> draw_scores(3, 2, dist="uniform", seed=0).shape
    (2, 3)
    """
    if dist not in DISTRIBUTIONS:
        raise InvalidArgumentError(f"unknown distribution {dist!r}; valid: {', '.join(DISTRIBUTIONS)}")
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(n, DISTRIBUTIONS.index(dist))))
    if dist == "normal":
        return rng.standard_normal((trials, n))
    if dist == "uniform":
        return rng.uniform(-_SQRT3, _SQRT3, (trials, n))
    if dist == "laplace":
        return rng.laplace(0.0, 1.0 / math.sqrt(2.0), (trials, n))
    return rng.standard_t(3, (trials, n)) / _SQRT3


# ---------------------------------------------------------------------------------------------
# memory


#: Largest working memory the probe will allocate for one (n, scale) unit of its grid, in bytes.
MAX_PROBE_BYTES = 2 * 1024**3


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def probe_memory(names: Sequence[str], n: int, kmax: int, trials: int) -> int:
    """Bytes the probe itself holds for one (n, scale) unit: draws, the tables of the
    GradTopK reference (two ``(n + 1, trials, kmax + 1)`` extended-precision tables, when a
    selected method uses them) and a stability model's outlook (a few ``(2k, trials, k)`` arrays).
    Methods need their own working memory on top (for the sequential ones ~ ``trials k n``)."""
    total = 6 * trials * n * 8  # draws, x, z, weights, reference, differences
    specs = [get_method(name) for name in names]
    if any(spec.probe.compute is not None or spec.stability is not None for spec in specs):
        total += 2 * (n + 1) * trials * (kmax + 1) * 16
    if any(spec.stability is not None for spec in specs):
        total += 6 * min(n, 2 * kmax) * trials * (kmax + 1) * 8
    return total


def _check_memory(names: Sequence[str], grid: Mapping[int, Sequence[int | float]], trials: int) -> None:
    for n, ks in grid.items():
        if not ks:
            continue
        need = probe_memory(names, n, math.ceil(max(ks)), trials)
        if need > MAX_PROBE_BYTES:
            raise InvalidArgumentError(
                f"the grid is too large: n={n}, k up to {max(ks)} and {trials} trials need about "
                f"{need / 1024**3:.3g} GiB for the probe's references, more than its "
                f"{MAX_PROBE_BYTES / 1024**3:.0f} GiB limit; use fewer trials or smaller n or k"
            )
