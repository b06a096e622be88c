"""The batched counterexample shrinker and the batched smoothness bisections against their
one-at-a-time definitions: same decisions, same budget accounting, same results."""

from __future__ import annotations

import dataclasses
import functools
import zlib
from collections.abc import Callable

import numpy as np
import pytest

from topk_cli.api import TopKResult, evaluate
from topk_cli.errors import InvalidArgumentError
from topk_cli.properties import checks, smoothness
from topk_cli.properties import evaluator as evaluator_module
from topk_cli.properties.results import Case
from topk_cli.properties.shrinking import _shrink
from topk_cli.properties.smoothness import (
    _bisect_entries,
    _evaluate_lines,
    _line_class,
    _saturated,
    _weight_above,
    _weight_at_least,
)


def _reference_shrink(violates: Callable[[np.ndarray, int], bool], x: np.ndarray, k: int, budget: int = 300):
    """The shrinker's definition: every candidate tried one at a time, in order.

    Chunks of size n/2, n/4, ..., 2 (the first that still fails is dropped, then the same size
    again), then single entries, then simpler values, then chunks and single entries again.
    """
    calls = 0

    def attempt(y: np.ndarray, kk: int) -> bool:
        nonlocal calls
        if calls >= budget or not 1 <= kk <= np.isfinite(y).sum():
            return False
        calls += 1
        try:
            return violates(y, kk)
        except InvalidArgumentError:
            return False

    def drop_entries(x: np.ndarray, k: int):
        changed = True
        while changed and x.size > 1:
            changed = False
            for i in range(x.size):
                y = np.delete(x, i)
                for kk in dict.fromkeys((k, k - 1, min(k, y.size))):
                    if attempt(y, kk):
                        x, k, changed = y, kk, True
                        break
                if changed:
                    break
        return x, k

    def drop_chunks(x: np.ndarray, k: int):
        size = x.size // 2
        while min(size, x.size // 2) >= 2:
            size = min(size, x.size // 2)
            changed = False
            for start in range(0, x.size - size + 1, size):
                y = np.delete(x, np.arange(start, start + size))
                for kk in dict.fromkeys((k, max(1, k - size), min(k, y.size))):
                    if attempt(y, kk):
                        x, k, changed = y, kk, True
                        break
                if changed:
                    break
            if not changed:
                size //= 2
        return x, k

    x, k = drop_entries(*drop_chunks(x, k))
    finite = np.isfinite(x)
    if finite.any():
        ranks = np.unique(x[finite], return_inverse=True)[1].astype(np.float64)
        y = x.copy()
        y[finite] = ranks
        if not np.array_equal(y, x) and attempt(y, k):
            x = y
        else:
            top = float(np.max(x[finite]))
            for shift in (top, round(top)):
                y = np.where(finite, x - shift, x)
                if shift != 0 and attempt(y, k):
                    x = y
                    break
    for decimals in (0, 1, 2, 4):
        with np.errstate(invalid="ignore"):
            y = np.where(np.isfinite(x), np.round(x, decimals), x)
        if not np.array_equal(y, x) and attempt(y, k):
            x = y
            break
    for i in range(x.size):
        for decimals in (0, 1, 2):
            if not np.isfinite(x[i]):
                break
            y = x.copy()
            y[i] = np.round(y[i], decimals)
            if y[i] != x[i] and attempt(y, k):
                x = y
                break
    x, k = drop_entries(*drop_chunks(x, k))
    return x, k


def _coin(p: float, salt: int) -> Callable[[np.ndarray, int], bool]:
    """A violation whose answers are a fixed pseudo-random function of the candidate."""

    def violates(y: np.ndarray, kk: int) -> bool:
        h = zlib.crc32(y.tobytes() + bytes([kk % 256, salt]))
        if h % 97 == 0:
            raise InvalidArgumentError("refused")
        return (h % 1000) < 1000 * p

    return violates


def _spread(y: np.ndarray, kk: int) -> bool:  # drops entries until few are left, then rounds
    f = y[np.isfinite(y)]
    return kk >= 2 and f.size >= 3 and float(f.max() - f.min()) > 1.0


def _late(y: np.ndarray, kk: int) -> bool:  # only the last entries can go: sweeps succeed late
    return y.size >= 4 and y[0] == 0.5 and kk == 2


VIOLATIONS = {
    "coin-0.3": _coin(0.3, 1),
    "coin-0.7": _coin(0.7, 2),
    "coin-0.95": _coin(0.95, 3),
    "spread": _spread,
    "late": _late,
}


def _inputs() -> list[tuple[np.ndarray, int]]:
    rng = np.random.default_rng(5)
    out = []
    for n, k in ((12, 4), (20, 19), (7, 1), (30, 10)):
        x = np.round(rng.standard_normal(n) * 3, 3)
        x[0] = 0.5
        out.append((x, k))
    x = rng.standard_normal(9) * 100
    x[[2, 5]] = -np.inf
    x[0] = 0.5
    out.append((x, 3))
    return out


@pytest.mark.parametrize("name", sorted(VIOLATIONS))
@pytest.mark.parametrize("budget", [300, 40, 7, 1])
def test_batched_shrink_walks_like_the_one_at_a_time_shrink(name: str, budget: int) -> None:
    violates = VIOLATIONS[name]
    for x, k in _inputs():
        tried_ref: list[tuple[bytes, int]] = []
        tried: list[tuple[bytes, int]] = []
        batches: list[list[tuple[bytes, int]]] = []

        def logged(log: list[tuple[bytes, int]]) -> Callable[[np.ndarray, int], bool]:
            def v(y: np.ndarray, kk: int) -> bool:
                log.append((y.tobytes(), kk))
                return violates(y, kk)

            return v

        def prefetch(candidates) -> None:
            batches.append([(y.tobytes(), kk) for y, kk in candidates])

        x_ref, k_ref = _reference_shrink(logged(tried_ref), x, k, budget)
        x_new, k_new = _shrink(logged(tried), x, k, budget, prefetch=prefetch)
        np.testing.assert_array_equal(x_new, x_ref)
        assert k_new == k_ref
        assert tried == tried_ref  # same candidates, same order: same decisions and budget use
        assert len(tried) <= budget
        announced = [c for batch in batches for c in batch]
        assert set(tried) <= set(announced)  # every candidate was prefetched before it was tried
        for batch in batches:  # never more than the budget left allows
            assert len(batch) <= budget
        x_plain, k_plain = _shrink(violates, x, k, budget)  # without the hook: the same
        np.testing.assert_array_equal(x_plain, x_ref)
        assert k_plain == k_ref


def test_a_sweep_that_finds_nothing_costs_few_batches() -> None:
    batches: list[int] = []
    x = np.arange(30, dtype=np.float64)
    _shrink(lambda y, kk: False, x, 10, prefetch=lambda c: batches.append(len(c)))
    # twice: chunks of 15, 7 and 3 (2, 4 and 10 chunks, each with k = 10 and 10 - size), one batch
    # per size; a sweep of 30 x 2 single drops (k = 10, 9) in 4 batches; and the two shifted
    # copies once: 186 candidates, each announced once, in 16 batches instead of 186 evaluations
    assert sum(batches) == 2 * (2 * (2 + 4 + 10) + 30 * 2) + 2
    assert len(batches) <= 16


def test_chunks_go_in_a_few_steps() -> None:
    calls: list[int] = []

    def both_remain(y: np.ndarray, kk: int) -> bool:  # fails iff entries 10 and 50 are both still there
        calls.append(y.size)
        return 10.0 in y and 50.0 in y

    x, k = _shrink(both_remain, np.arange(64, dtype=np.float64), 1)
    np.testing.assert_array_equal(x, [10.0, 50.0])
    assert k == 1
    # single drops alone need at least one call per dropped entry (62), chunks far fewer
    assert len(calls) <= 40
    assert min(calls[:3]) <= 48  # a chunk of 16 went in the first few calls


@pytest.mark.parametrize("name", sorted(VIOLATIONS))
def test_the_result_is_one_minimal(name: str) -> None:
    violates = VIOLATIONS[name]
    checked = 0
    for x, k in _inputs():
        calls = 0

        def counted(y: np.ndarray, kk: int) -> bool:
            nonlocal calls
            calls += 1
            return violates(y, kk)

        y, kk = _shrink(counted, x, k)
        if calls >= 300:  # the budget ran out: no promise
            continue
        checked += 1
        for i in range(y.size):
            z = np.delete(y, i)
            for kz in dict.fromkeys((kk, kk - 1, min(kk, z.size))):
                if 1 <= kz <= np.isfinite(z).sum():
                    try:
                        assert not violates(z, kz), (i, kz)
                    except InvalidArgumentError:
                        pass
    assert checked >= 3


def test_a_failing_prefetch_changes_nothing() -> None:
    def broken(candidates) -> None:
        raise ArithmeticError("boom")

    for x, k in _inputs():
        ref = _reference_shrink(_spread, x, k)
        new = _shrink(_spread, x, k, prefetch=broken)
        np.testing.assert_array_equal(new[0], ref[0])
        assert new[1] == ref[1]


@pytest.mark.parametrize("method", ["hard", "thre-exp"])
def test_checks_shrink_to_the_same_counterexample_with_fewer_calls(method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)
    cases = [Case(tuple(rng.standard_normal(12).round(2)), k) for k in (1, 3, 11)]
    calls: list[int] = []

    def counting(x, *args, **kwargs):
        calls.append(len(x))
        return evaluate(x, *args, **kwargs)

    monkeypatch.setattr(evaluator_module, "evaluate", counting)  # the operator calls of the checks
    batched = checks.check_monotone_strict(method, cases)
    n_batched = len(calls)
    calls.clear()
    monkeypatch.setattr(checks, "_shrink", lambda v, x, k, prefetch=None: _reference_shrink(v, x, k))
    plain = checks.check_monotone_strict(method, cases)
    assert (batched.counterexample, batched.worst, batched.violations) == (plain.counterexample, plain.worst, plain.violations)
    assert batched.counterexample is not None
    assert n_batched < len(calls)


def _reference_bisect(method: str, x: np.ndarray, k: int, tau: float, i: int, predicate, evaluate=evaluate):
    """The bisection's definition, one entry at a time (one operator call per round)."""
    finite = x[np.isfinite(x)]
    lo, hi = float(finite.min()) - 60 * tau, float(finite.max()) + 60 * tau
    for _ in range(9):
        grid = np.linspace(lo, hi, 64)
        batch = np.repeat(x[None, :], grid.size, axis=0)
        batch[:, i] = grid
        r = evaluate(batch, k, method, tau=tau)
        if not (r.status == "ok").all():
            return None
        flags = predicate(r.weights, r.complement)
        if flags[0] or not flags[-1]:
            return None
        first = int(np.argmax(flags))
        lo, hi = float(grid[first - 1]), float(grid[first])
        if hi - lo <= 1e-13 * max(1.0, abs(hi)):
            break
    out = x.copy()
    out[i] = hi
    return out


def _refusing(x: np.ndarray, k: int, method: str, *, tau: float = 1.0) -> TopKResult:
    """``evaluate`` that also refuses every row with ``x_0 > 1.5`` (only entry 0's grids move it)."""
    r = evaluate(x, k, method, tau=tau)
    status = np.where(np.asarray(x)[:, 0] > 1.5, "nan", r.status)
    return dataclasses.replace(r, status=status)


@pytest.mark.parametrize(("method", "refusing"), [("thre-exp", False), ("grad", False), ("hard", False), ("iterative", True)])
def test_lockstep_bisections_land_where_single_ones_do(method: str, refusing: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.array([0.3, -1.2, 2.0, 0.1, -0.4])
    tasks = []
    for i in (2, 0, 4):
        tasks += [
            (i, functools.partial(_weight_at_least, i=i, level=0.5)),
            (i, functools.partial(_saturated, i=i)),
            (i, functools.partial(_weight_above, i=i, level=0.0)),
        ]
    fn = _refusing if refusing else evaluate
    monkeypatch.setattr(smoothness, "evaluate", fn)
    got = _bisect_entries(method, x, 2, 0.7, tasks)
    want = [_reference_bisect(method, x, 2, 0.7, i, pred, fn) for i, pred in tasks]
    assert [g is None for g in got] == [w is None for w in want]
    assert sum(g is not None for g in got) >= 2
    for g, w in zip(got, want, strict=True):
        if w is not None:
            np.testing.assert_array_equal(g, w)


def test_lines_evaluated_together_classify_like_lines_alone() -> None:
    rng = np.random.default_rng(2)
    tie, plain = np.array([0.5, 0.5, -0.3, 1.1]), np.array([0.41, 0.77, -0.3, 1.1])
    lines = [(x0, d / np.linalg.norm(d)) for x0, d in zip((tie, plain, tie, plain), rng.standard_normal((4, 4)), strict=True)]
    for method in ("hard", "thre-laplace"):
        rows = _evaluate_lines(method, lines, 2, 1.0)
        got = [_line_class(method, x0, 2, 1.0, d, r) for (x0, d), r in zip(lines, rows, strict=True)]
        assert got == [_line_class(method, x0, 2, 1.0, d) for x0, d in lines]
    assert len({g[0] for g in got if g is not None}) == 1  # thre-laplace: smooth everywhere
    hard = [_line_class("hard", x0, 2, 1.0, d, r) for (x0, d), r in zip(lines, _evaluate_lines("hard", lines, 2, 1.0), strict=True)]
    assert [h[0] if h else None for h in hard] == ["discontinuous", "C-infinity", "discontinuous", "C-infinity"]
