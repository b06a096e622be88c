"""The property checks' per-case shortcuts return what the direct computations return."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import same_bits

from topk_cli.properties.evaluator import Evaluator, _z
from topk_cli.properties.results import Case
from topk_cli.properties.verify import default_suite
from topk_cli.properties.violations import _limit_row, _permutations, _shift_rows, _strict_pairs


def _same(a: object, b: object) -> bool:
    """Equal, with arrays compared bit for bit (dtype, shape, bytes)."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(u, v) for u, v in zip(a, b, strict=True))
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return same_bits(a, b)
    return type(a) is type(b) and (a == b or (a != a and b != b))  # type: ignore[comparison-overlap]


def _cases() -> list[tuple[np.ndarray, int, float]]:
    suite = default_suite(trials=1, seed=5)[::7]
    extra = [
        (np.array([3.0, -np.inf, 1.0, 2.0]), 1, 1.0),
        (np.array([3.0, -np.inf, 1.0, 2.0]), 2, 0.5),
        (np.array([1e300, -1e300, 0.0]), 1, 1e-300),
        (np.array([2.0, 2.0, 2.0]), 1, 1.0),
    ]
    return [(c.array, c.k, c.tau) for c in suite] + [(x, k, tau) for x, k, tau in extra] + [
        (x, k, 2.0 * tau) for x, k, tau in extra
    ]


@pytest.mark.parametrize("fn", [_strict_pairs, _limit_row, _shift_rows])
def test_memo_returns_the_direct_value_for_every_case(fn) -> None:  # type: ignore[no-untyped-def]
    cases = _cases()
    ev = Evaluator()
    first = [ev.memo(fn, x, k, tau) for x, k, tau in cases]  # fill the memo, then read it back in reverse
    again = [ev.memo(fn, x.copy(), k, tau) for x, k, tau in reversed(cases)][::-1]
    for (x, k, tau), a, b in zip(cases, first, again, strict=True):
        direct = fn(x, k, tau)
        assert _same(a, direct) and _same(b, direct), (x, k, tau)


def test_memo_computes_once_per_equal_input_and_separates_k_tau_and_x() -> None:
    calls: list[tuple[bytes, int, float]] = []

    def probe(x: np.ndarray, k: int, tau: float) -> tuple[float, int, float]:
        calls.append((x.tobytes(), k, tau))
        return float(x.sum()), k, tau

    ev = Evaluator()
    x = np.array([3.0, 1.0, 2.0])
    assert ev.memo(probe, x, 1, 1.0) == (6.0, 1, 1.0)
    assert ev.memo(probe, x.copy(), 1, 1.0) == (6.0, 1, 1.0)  # equal bytes: remembered
    assert len(calls) == 1
    assert ev.memo(probe, x, 2, 1.0) == (6.0, 2, 1.0)
    assert ev.memo(probe, x, 1, 0.5) == (6.0, 1, 0.5)
    assert ev.memo(probe, x[::-1], 1, 1.0) == (6.0, 1, 1.0) and len(calls) == 4  # another vector
    assert ev.memo(probe, x[:2], 1, 1.0) == (4.0, 1, 1.0)
    ev.clear()
    ev.memo(probe, x, 1, 1.0)
    assert len(calls) == 6


def test_row_key_is_the_same_for_a_strided_view_and_its_copy() -> None:
    base = np.arange(12.0).reshape(3, 4)
    view = base[:, 1]  # non-contiguous
    assert Evaluator._key("m", view, 1, 1.0) == Evaluator._key("m", view.copy(), 1, 1.0)
    assert Evaluator._key("m", np.array([1, 2]), 1, 1.0) == Evaluator._key("m", np.array([1.0, 2.0]), 1, 1.0)


def _z_masked(x: np.ndarray, tau: float) -> np.ndarray:
    finite = np.isfinite(x)
    top = np.max(x[finite]) if finite.any() else 0.0
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return np.where(finite, (x - top) / tau, -np.inf)


def test_scaled_scores_and_permutations_match_their_plain_definitions() -> None:
    for x, _, tau in _cases():
        assert _same(_z(x, tau), _z_masked(x, tau))
        for small in (1e-300, 3e-7):
            assert _same(_z(x, small), _z_masked(x, small))
    for n in range(1, 9):
        reverse, rotate = _permutations(n)
        assert reverse.tolist() == np.arange(n)[::-1].tolist()
        assert _same(rotate, np.roll(np.arange(n), 1))


def test_case_array_is_built_once_and_read_only() -> None:
    case = Case((3.0, 1.0, 2.0), 2)
    assert case.array is case.array
    assert _same(case.array, np.asarray(case.x, dtype=np.float64))
    with pytest.raises(ValueError):
        case.array[0] = 0.0
    assert case == Case((3.0, 1.0, 2.0), 2) and hash(case) == hash(Case((3.0, 1.0, 2.0), 2))
