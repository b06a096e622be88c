"""Hardness calibration: the tau at which a method's mean top-k mass reaches a target."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

import topk_cli as st
from topk_cli.analysis.hardness import calibrate_hardness, tau_grid, topk_mass
from topk_cli.errors import InvalidArgumentError

SMOOTH = [name for name, spec in st.METHODS.items() if spec.family != "baseline"]


def _standardised(rows: int, n: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((rows, n))
    return (x - x.mean(axis=1, keepdims=True)) / x.std(axis=1, keepdims=True)


def _mass(x: np.ndarray, k: int, method: str, tau: float) -> tuple[float, float]:
    """Independent of the module: hard top-k by sorting (no ties in continuous data)."""
    r = st.evaluate(x, k, method, tau=tau)
    ok = r.status == "ok"
    top = np.argsort(-x, axis=1)[:, :k]
    mask = np.zeros_like(x)
    np.put_along_axis(mask, top, 1.0, axis=1)
    return float(np.mean(np.sum(mask[ok] * r.weights[ok], axis=1)) / k), float(np.count_nonzero(~ok) / ok.size)


@pytest.mark.parametrize("h", [0.6, 0.9])
def test_closed_form_for_two_entries(h: float) -> None:
    # n = 2, k = 1, x = (1, 0): thre-sigmoid gives p1 = sigmoid(0.5 / tau) and grad (softmax)
    # gives p1 = sigmoid(1 / tau), so the tau of mass h is 0.5 / logit(h) and 1 / logit(h).
    logit = math.log(h / (1 - h))
    for method, expected in (("thre-sigmoid", 0.5 / logit), ("grad", 1.0 / logit)):
        m = st.tau_for_hardness([1.0, 0.0], 1, method, h)
        assert m.status == "ok"
        assert m.tau == pytest.approx(expected, rel=1e-3)
        assert h <= m.mass <= h + 1e-4


@pytest.mark.parametrize("method", SMOOTH)
def test_every_method_reaches_the_target_or_says_why(method: str) -> None:
    x = _standardised(100, 20)
    (m,) = calibrate_hardness(x, 3, method, [0.8])
    if m.status in ("unreachable", "constant"):
        assert m.tau is None and m.reason
        return
    assert m.tau is not None and m.mass is not None
    mass, refused = _mass(x, 3, method, m.tau)
    assert mass == pytest.approx(m.mass, abs=1e-12)
    assert refused <= 0.01
    if m.status == "ok":
        assert 0.8 <= mass <= 0.8 + 5e-3
    else:  # approximate: the mean mass jumps over the target; the reason says where
        assert m.status == "approximate" and "jumps" in m.reason and mass >= 0.8
    # the largest such tau: every softer grid tau misses the target or refuses too many rows
    for tau in tau_grid(x):
        if tau > m.tau * 1.0001:
            softer, refused = _mass(x, 3, method, tau)
            assert softer < 0.8 or refused > 0.01, (tau, softer)


def test_exact_operators_hit_the_target_within_tolerance() -> None:
    x = _standardised(200, 20, seed=1)
    for method in ("grad", "thre-exp", "thre-sigmoid", "thre-laplace"):
        matches = calibrate_hardness(x, 3, method, [0.6, 0.8, 0.95])
        for h, m in zip((0.6, 0.8, 0.95), matches, strict=True):
            assert m.status == "ok", (method, m)
            assert h <= m.mass <= h + 1e-4
            # monotone: a slightly softer tau misses the target
            assert topk_mass(x, 3, method, m.tau * 1.01)[0] < h


def test_non_monotone_mass_takes_the_softest_grid_crossing() -> None:
    # weighted-softmax's mean mass is not monotone in tau (poles), so bisection between the ends
    # of the grid could stop at any crossing; the calibration scans the grid from the soft end
    # and refines between the first grid tau that reaches the target and its softer neighbour.
    x = _standardised(200, 20)
    grid = tau_grid(x)
    fine = [_mass(x, 3, "weighted-softmax", t)[0] for t in np.geomspace(0.35, 0.5, 6)]
    assert any(b > a + 0.01 for a, b in itertools.pairwise(fine)), "the mass should rise somewhere with tau"
    masses = [_mass(x, 3, "weighted-softmax", t) for t in grid[:12]]
    first = next(i for i, (m, r) in enumerate(masses) if m >= 0.6 and r <= 0.01)
    (m,) = calibrate_hardness(x, 3, "weighted-softmax", [0.6])
    assert m.tau is not None and m.mass is not None and m.mass >= 0.6
    assert grid[first] <= m.tau < grid[first - 1]


def test_refusals_and_constant_mass_are_unreachable_with_a_reason() -> None:
    x = _standardised(200, 20)
    (m,) = calibrate_hardness(x, 3, "grad-recursive", [0.95])
    assert m.status == "unreachable" and "refuses" in m.reason
    m = st.tau_for_hardness(x, 3, "hard", 0.8)
    assert m.status == "constant" and m.tau is None and m.mass == 1.0
    assert m.reason == "the top-k mass is 1 at every tau"


def test_validation() -> None:
    with pytest.raises(InvalidArgumentError, match=r"\(k/n, 1\)"):
        st.tau_for_hardness([3.0, 2.0, 1.0, 0.0], 2, "grad", 0.5)  # k/n = 0.5
    with pytest.raises(InvalidArgumentError, match=r"\(k/n, 1\)"):
        st.tau_for_hardness([3.0, 2.0, 1.0, 0.0], 2, "grad", 1.0)
    with pytest.raises(InvalidArgumentError, match="unknown method"):
        st.tau_for_hardness([3.0, 2.0, 1.0], 1, "nope", 0.8)
    with pytest.raises(InvalidArgumentError, match="k must"):
        st.tau_for_hardness([3.0, 2.0, 1.0], 5, "grad", 0.8)
    with pytest.raises(InvalidArgumentError, match="NaN"):
        st.tau_for_hardness([3.0, float("nan"), 1.0], 1, "grad", 0.8)


def test_masked_entries_count_as_absent() -> None:
    # -inf entries are never selected: the uniform mass is k / (unmasked entries)
    x = np.array([[2.0, 1.0, 0.0, -np.inf]])
    with pytest.raises(InvalidArgumentError, match=r"0\.3333"):
        st.tau_for_hardness(x, 1, "grad", 0.3)
    m = st.tau_for_hardness(x, 1, "grad", 0.9)
    assert m.status == "ok" and m.mass == pytest.approx(0.9, abs=1e-4)


# ---- --hardness in compute and temperature-sweep ---------------------------------------------

SAMPLES = Path(__file__).resolve().parent.parent / "sample_inputs"


def test_compute_picks_a_tau_per_method() -> None:
    r = run_cli("compute", "-m", "grad,thre-sigmoid,hard", "-k", "2", "--hardness", "0.9", "--format", "json", str(SAMPLES / "router_logits.csv"))
    assert r.code == 0, r.output
    doc = json.loads(r.out)
    assert doc["tau"] is None and doc["hardness"] == 0.9
    hard = np.array(doc["hard"])
    taus = {}
    for res in doc["results"]:
        if res["method"] == "hard":
            assert res["hardness_status"] == "constant" and res["status"][0] == "ok"
            continue
        assert res["hardness_status"] == "ok"
        w = np.array(res["weights"], dtype=float)
        mass = float(np.mean(np.sum(hard * w, axis=1)) / 2)
        assert mass == pytest.approx(0.9, abs=1e-4) and res["topk_mass"] == pytest.approx(mass, abs=1e-12)
        taus[res["method"]] = res["tau"]
    assert taus["grad"] != taus["thre-sigmoid"]
    assert "grad: tau = " in r.err and "hard: does not depend on tau" in r.err


def test_compute_table_and_unreachable_method_exit_1() -> None:
    r = run_cli("compute", "-m", "grad-recursive", "-m", "grad", "-k", "2", "--hardness", "0.99", str(SAMPLES / "router_logits.csv"))
    assert r.code == 1
    assert "top-k mass 0.99" in r.out and "grad-recursive: cannot reach top-k mass 0.99: refuses more than 1%" in r.out
    assert "unreachable" in r.out
    bad = run_cli("compute", "-k", "2", "--hardness", "0.2", "--values", "3,2,1,0")
    assert bad.code == 2 and bad.err.startswith("softtopk: error: hardness must be a top-k mass in (k/n, 1)")


def test_temperature_sweep_measures_each_method_at_equal_hardness() -> None:
    r = run_cli("temperature-sweep", "-k", "2", "-m", "thre-exp,grad,hard", "--taus", "1", "--hardness", "0.9", "--format", "json")
    assert r.code == 0, r.output
    rows = {h["method"]: h for h in json.loads(r.out)["hardness"]}
    for method in ("thre-exp", "grad"):
        assert rows[method]["hardness_status"] == "ok" and rows[method]["topk_mass"] == pytest.approx(0.9, abs=1e-4)
        assert rows[method]["jacobian_norm"] > 0
    assert rows["thre-exp"]["tau"] != rows["grad"]["tau"]
    assert rows["hard"]["hardness_status"] == "constant" and rows["hard"]["tau"] is None
    table = run_cli("temperature-sweep", "-k", "2", "-m", "grad", "--taus", "1", "--hardness", "0.9")
    assert table.code == 0 and "At equal hardness" in table.out
