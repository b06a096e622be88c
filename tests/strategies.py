"""Hypothesis strategies for score vectors and property-check cases.

Vectors mix the regimes that break top-k operators: moderate random scores, tiny and huge
spreads, big offsets, exact ties and near-ties, and masked (-inf) entries.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from topk_cli.properties import Case

SPREADS = (1e-3, 1e-1, 1.0, 10.0, 300.0)
OFFSETS = (0.0, -5.0, 1e6)


@st.composite
def score_vectors(draw: st.DrawFn, *, min_n: int = 1, max_n: int = 12, allow_mask: bool = False) -> np.ndarray:
    """A float64 vector of length ``min_n..max_n`` (ties, near-ties, spreads, offsets)."""
    n = draw(st.integers(min_n, max_n))
    unit = draw(
        st.lists(st.floats(-1.0, 1.0, allow_nan=False, allow_subnormal=False), min_size=n, max_size=n)
    )
    x = np.asarray(unit, dtype=np.float64)
    shape = draw(st.sampled_from(("plain", "ties", "near-ties", "integers")))
    if shape == "ties" and n >= 2:
        idx = draw(st.lists(st.integers(0, n - 1), min_size=n, max_size=n))
        x = x[np.asarray(idx)]
    elif shape == "near-ties" and n >= 2:
        x = x[0] + 1e-9 * np.arange(n) * draw(st.sampled_from((1.0, -1.0)))
    elif shape == "integers":
        x = np.round(3 * x)
    x = draw(st.sampled_from(OFFSETS)) + draw(st.sampled_from(SPREADS)) * x
    if allow_mask and n >= 2 and draw(st.booleans()):
        x[draw(st.integers(0, n - 1))] = -np.inf
    return x


@st.composite
def cases(draw: st.DrawFn, *, min_n: int = 1, max_n: int = 12, k: int | None = None) -> Case:
    """A :class:`Case`: vector, a valid k (1, 2, n-1, n or any) and tau."""
    x = draw(score_vectors(min_n=min_n, max_n=max_n))
    n = x.shape[-1]
    if k is None:
        k_choice = draw(st.sampled_from(("1", "2", "n-1", "n", "any")))
        k_value = {"1": 1, "2": min(2, n), "n-1": max(1, n - 1), "n": n}.get(k_choice) or draw(st.integers(1, n))
    else:
        k_value = min(k, n)
    tau = draw(st.sampled_from((0.1, 1.0, 3.0)))
    return Case(tuple(float(v) for v in x), k_value, tau, "hypothesis")
