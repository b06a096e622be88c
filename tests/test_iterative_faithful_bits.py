"""``iterative``'s faithful path gives the same bits as before it was made cheaper (the verbatim copy
in ``iterative_faithful_old.py``): ``p``, ``q``, codes, levels, values, messages and every ``aux``
array, on single rows and batches with ties, masked entries, saturation and refused rows."""

from __future__ import annotations

import functools

import iterative_faithful_old as old
import numpy as np
import pytest
from conftest import same_bits

from topk_cli.operators import _iterative_fast
from topk_cli.operators import iterative as it
from topk_cli.operators._base import Forward

# the old copy runs its rounds without an errstate: blown-up rows warn there (not in the current path)
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _rows(rng: np.random.Generator, n: int, tau: float, kind: str) -> np.ndarray:
    """One row of ``z = x / tau`` shifted to max 0 (masked entries ``-inf``)."""
    x = rng.standard_normal(n)
    if kind == "ties":  # exact ties, several groups (and at tiny tau the ties dominate)
        x = np.round(x * 2.0) / 2.0
    elif kind == "near":  # near-ties: gaps of a few ulps to 1e-9 between neighbours
        x = np.repeat(rng.standard_normal(1), n) + rng.integers(0, 4, n) * 1e-9
    elif kind == "saturated":  # one entry far above the rest
        x[rng.integers(n)] += 50.0
    z = x / tau
    z = z - z.max()
    if kind == "masked" and n > 2:
        z[rng.choice(n, size=n // 3 or 1, replace=False)] = -np.inf
        z = z - z[np.isfinite(z)].max()
    return z


def _cases() -> list[tuple[np.ndarray, int]]:
    rng = np.random.default_rng(20261123)
    cases: list[tuple[np.ndarray, int]] = []
    kinds = ("plain", "ties", "near", "saturated", "masked")
    for n in (1, 2, 3, 17, 200):
        ks = sorted({k for k in (1, 2, n - 1, n) if k >= 1})
        for k in ks:
            taus = (1e-3, 0.3, 10.0) if n < 200 else ((1e-3,) if k > 2 else (1e-3, 1.0))
            for tau in taus:
                for kind in kinds if n < 200 else ("plain", "ties", "masked"):
                    rows = np.stack([_rows(rng, n, tau, kind) for _ in range(1 if n == 200 else 3)])
                    live = np.isfinite(rows).sum(axis=1).min()
                    if k > live:
                        continue
                    cases.append((rows[:1], k))  # a single row, as the shrinker calls it
                    if rows.shape[0] > 1:
                        cases.append((rows, k))  # a batch: rows with and without ties or masks together
    # a batch mixing every kind (ties in some rows only, masks in others, refused rows)
    mix = np.stack([_rows(rng, 17, tau, kind) for tau in (1e-3, 0.05, 2.0) for kind in kinds])
    cases.append((mix, 5))
    # a batch large enough for the round's error propagation to spread its operands (B n >= 1366)
    wide = np.stack([_rows(rng, 200, tau, kind) for tau in (1e-3, 0.5) for kind in kinds])
    cases.append((wide, 3))
    # known hard rows: huge tied maxima, spreads beyond exp's range, a 1e20 spread with ties
    cases.append((np.array([[4e6, 4e6, 4e6, 0.0]]) - 4e6, 4))
    cases.append((np.array([[0.0, -800.0, -1600.0, -1e5, -1e300]]), 3))
    cases.append((np.array([[0.0, -1.5e20, -0.2e20, 0.0], [0.0, -1.0, -1.0, -2.0]]), 2))
    return cases


_same = same_bits


def _differences(new: Forward, ref: Forward) -> list[str]:
    out = [name for name in ("p", "q", "code", "level", "value") if not _same(getattr(new, name), getattr(ref, name))]
    if new.messages != ref.messages:
        out.append("messages")
    if new.aux.keys() != ref.aux.keys():
        out.append("aux keys")
    out += [f"aux[{name}]" for name in ref.aux if name in new.aux and not _same(new.aux[name], ref.aux[name])]
    return out


@functools.cache
def _reference() -> list[Forward]:
    return [old._it_faithful(z, k) for z, k in _cases()]


def test_the_cases_cover_refused_ok_masked_and_tied_rows() -> None:
    refs = _reference()
    codes = np.concatenate([fwd.codes() for fwd in refs])
    assert (codes == "ill-conditioned").sum() >= 5 and (codes == "ok").sum() >= 50
    assert any(np.isneginf(z).any() for z, _ in _cases())
    assert any(fwd.messages for fwd in refs)


def test_the_faithful_path_gives_the_same_bits_as_before() -> None:
    for (z, k), ref in zip(_cases(), _reference(), strict=True):
        new = it._it_faithful(z, k)
        assert not _differences(new, ref), (z.shape, k, _differences(new, ref))


def test_the_comparison_sees_a_one_ulp_change(monkeypatch: pytest.MonkeyPatch) -> None:
    # mutation check: one ulp more on every s of a round changes the compared bits
    softmax = it._it_softmax

    def nudged(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        s, c, local = softmax(*args, **kwargs)  # type: ignore[arg-type]
        return np.nextafter(s, np.inf), c, local

    monkeypatch.setattr(it, "_it_softmax", nudged)
    (z, k), ref = _cases()[-2], _reference()[-2]
    assert _differences(it._it_faithful(z, k), ref)


def _fast_block(block, z: np.ndarray, k: int) -> tuple[np.ndarray, ...]:  # type: ignore[no-untyped-def]
    """Run a version of the fast rounds on ``z`` and return everything they write and return."""
    bsz, n = z.shape
    d = z - z.min(axis=-1, keepdims=True)
    s_st, ctop, top = np.empty((bsz, k, n)), np.empty((bsz, k)), np.empty((bsz, k))
    p, q = np.zeros_like(z), np.empty_like(z)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        ep, certified = block(z, d, k, s_st, ctop, top, p, q)
    return ep, certified, s_st, ctop, top, p, q


def test_the_fast_rounds_give_the_same_bits_as_before() -> None:
    rng = np.random.default_rng(11)
    certified = rows = 0
    for n in (1, 2, 3, 17, 200):
        for k in sorted({1, 2, max(1, n - 1), n}):
            for tau in (1e-3, 0.05, 1.0, 30.0) if n < 200 else (1e-3, 1.0):
                for kind in ("plain", "ties", "saturated"):
                    z = np.stack([_rows(rng, n, tau, kind) for _ in range(3)])
                    new, ref = _fast_block(_iterative_fast._it_fast_block, z, k), _fast_block(old._it_fast_block, z, k)
                    assert all(_same(a, b) for a, b in zip(new, ref, strict=True)), (n, k, tau, kind)
                    certified += int(ref[1].sum())
                    rows += z.shape[0]
    assert 0 < certified < rows  # both certified and refused rows were compared
