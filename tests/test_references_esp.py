"""GradTopK's reference (the exact program behind ``stability-probe``'s ``grad`` cells) and the
recursion outlook built on its tables.

The linear-space tables are checked against mpmath (40+ digits) on adversarial rows, where the
log-space program they replace loses up to 1e-14; the log-space program, still used when the
binomial bound leaves the range of ``np.longdouble``, keeps the bits of the previous code
(verbatim in ``esp_v0``)."""

from __future__ import annotations

import esp_v0 as old
import numpy as np
import pytest
import reference as ref
from mpmath import mp, mpf

from topk_cli import references
from topk_cli.analysis.probe_grid import draw_scores
from topk_cli.api import scaled_scores
from topk_cli.recursion import outlook_from_tables
from topk_cli.references import EspTables, LinearEsp, esp_tables, esp_weights, log_esp_tables, weights_len

_FIELDS = ("predicted_level", "saturation_level", "min_complement", "digits_lost")


def _batches() -> list[np.ndarray]:
    out = []
    for n, scale in ((9, 0.5), (120, 2.0), (120, 40.0), (160, 700.0), (160, 9000.0)):
        z = scaled_scores(scale * draw_scores(n, 5, dist="normal", seed=3), 1)
        z[1, 3] = z[1, 4]  # a tie
        z[2, n - 2] = -np.inf  # a masked entry
        z[3, : n - 4] = -np.inf  # fewer finite entries than the larger k
        z[3] -= np.max(z[3])
        out.append(z)
    return out


@pytest.mark.parametrize("z", _batches(), ids=lambda z: f"n{z.shape[1]}")
def test_log_space_program_keeps_its_bits(z: np.ndarray) -> None:
    n = z.shape[1]
    ks = [k for k in (1, 2, 3, 7, 12) if k <= n]
    before = old.esp_tables(z, max(ks), n)
    tab = log_esp_tables(z, max(ks))  # forward table cut to the positions the weights read
    for k in ks:
        assert esp_weights(tab, k).tobytes() == old.esp_weights(before, k).tobytes(), k
        with np.errstate(invalid="ignore"):  # rows with few finite entries (as before)
            a, b = old.outlook_from_tables(before, k), outlook_from_tables(tab, k)
        for field in _FIELDS:
            assert getattr(a, field).tobytes() == getattr(b, field).tobytes(), (k, field)


@pytest.mark.parametrize("z", _batches(), ids=lambda z: f"n{z.shape[1]}")
def test_outlook_from_linear_tables_agrees_with_log_space(z: np.ndarray) -> None:
    ks = [k for k in (1, 2, 3, 7, 12) if k <= z.shape[1]]
    lin, log = esp_tables(z, max(ks)), log_esp_tables(z, max(ks))
    assert isinstance(lin, LinearEsp)
    for k in ks:
        with np.errstate(invalid="ignore"):
            a, b = outlook_from_tables(log, k), outlook_from_tables(lin, k)
        assert np.array_equal(a.predicted_level, b.predicted_level)
        assert np.array_equal(a.saturation_level, b.saturation_level)
        # the model runs in float64 on logs up to ~1e5 here: 1e-11 absolute, relative in c
        assert np.allclose(a.min_complement, b.min_complement, rtol=1e-9, atol=0, equal_nan=True)
        assert np.allclose(a.digits_lost, b.digits_lost, rtol=1e-12, atol=1e-12, equal_nan=True)


def _adversarial() -> list[tuple[np.ndarray, list[int]]]:
    rng = np.random.default_rng(2026)
    rows = []
    for scale in (0.3, 40.0, 3000.0):
        rows.append((rng.standard_normal(40) * scale, [1, 2, 5, 20, 39]))
    ties = np.round(rng.standard_normal(40) * 3)
    rows.append((ties, [1, 3, 20, 39]))
    masked = rng.standard_normal(40) * 50
    masked[[3, 17, 31]] = -np.inf
    rows.append((masked, [1, 2, 18, 36, 37]))
    # gaps of 1e4 next to a near tie: the log-space program is 2e-15 off at k = n - 1
    gaps = np.concatenate([[0.0, -1e-3, -2e4, -2e4 - 1e-9], -1e4 * rng.random(8)])
    rows.append((gaps, [1, 2, 6, 11]))
    return [(z - np.max(z), ks) for z, ks in rows]


def exact_grad(z: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``p`` and ``1 - p`` of GradTopK, each summed directly (relative accuracy for both; the
    reference's ``1 - q`` for ``k > n / 2`` is only absolutely accurate)."""
    idx = np.flatnonzero(np.isfinite(z))
    with mp.workdps(ref._dps([float(v) for v in z[idx]], 1.0, 40)):
        w = [mpf(float(v)) for v in z[idx]]
        m = len(w)
        p = ref._esp_marginals(w, k)
        top = max(-v for v in w)
        q = ref._esp_marginals([-v - top for v in w], m - k) if k < m else [mpf(0)] * m
        p_out, q_out = np.zeros(len(z)), np.ones(len(z))
        p_out[idx] = [float(v) for v in p]
        q_out[idx] = [float(v) for v in q]
    return p_out, q_out


@pytest.mark.parametrize("row", range(6))
def test_reference_weights_match_mpmath(row: int) -> None:
    """Relative error of every weight (not subnormal) within the float64 rounding of the exact
    value, and of ``1 - p`` likewise where ``1 - p`` carries digits (>= 1e-3)."""
    z, ks = _adversarial()[row]
    tab = esp_tables(z[None, :], max(ks))
    for k in ks:
        p = esp_weights(tab, k)[0]
        exact, complement = exact_grad(z, k)
        normal = exact >= 1e-300
        assert np.all(np.abs(p - exact)[normal] <= 2.3e-16 * exact[normal]), k
        assert np.all(p[~normal] <= 1e-300), k
        big = complement >= 1e-3
        assert np.all(np.abs((1 - p) - complement)[big] <= 1e-13 * complement[big]), k


def test_skipped_weights_are_zero() -> None:
    """Positions past ``weights_len`` have weight 0 in the full computation too, and some are cut."""
    z = scaled_scores(3000.0 * draw_scores(60, 4, dist="normal", seed=5), 1)
    full = old.esp_tables(z, 5, 60)
    for k in (1, 2, 5):
        m = weights_len(esp_tables(z, 5).s, k)
        assert k <= m < 60
        p_sorted = np.take_along_axis(old.esp_weights(full, k), full.order, axis=-1)
        assert (p_sorted[:, m:] == 0).all()


def test_binomials_beyond_the_extended_range_use_the_log_space_program(monkeypatch: pytest.MonkeyPatch) -> None:
    z = _batches()[1]
    lin = esp_tables(z, 7)
    monkeypatch.setattr(references, "_MAX_LOG_BINOMIAL", 10.0)
    log = esp_tables(z, 7)
    assert isinstance(lin, LinearEsp) and isinstance(log, EspTables)
    for k in (1, 3, 7):
        assert np.allclose(esp_weights(lin, k), esp_weights(log, k), rtol=1e-13, atol=1e-16, equal_nan=True)
