"""stability_probe and grad_recursive_outlook: detection, prediction, references, determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest

import topk_cli as st
from topk_cli.analysis.probe import (
    DEFAULT_METHODS,
    MAX_PROBE_BYTES,
    _order_violations,
    _score_order,
    draw_scores,
    grad_recursive_outlook,
    parse_scales,
    probe_memory,
    resolve_k,
    stability_probe,
)
from topk_cli.errors import InvalidArgumentError


def _cells(report, method):
    return [c for c in report.cells if c.method == method]


def test_parse_scales_is_log_spaced_and_inclusive():
    assert parse_scales("0.1:1e4:13")[0] == 0.1
    assert parse_scales("0.1:1e4:13")[-1] == 1e4
    assert len(parse_scales("0.1:1e4:13")) == 13
    assert parse_scales("10,1,1") == (1.0, 10.0)
    for bad in ("1:0.1:3", "0:1:3", "a,b", "1:2", "-1,2", "inf"):
        with pytest.raises(InvalidArgumentError, match="scales"):
            parse_scales(bad)


def test_resolve_k_integers_fractions_and_skips():
    assert resolve_k("5", 10) == 5
    assert resolve_k("50", 10) is None
    assert resolve_k("0.5n", 10) == 5
    assert resolve_k("0.01n", 10) == 1
    for bad in ("0", "-1", "1.5n", "x"):
        with pytest.raises(InvalidArgumentError, match="k must be"):
            resolve_k(bad, 10)


def test_probe_finds_grad_recursive_failures_and_none_for_grad():
    report = stability_probe(methods=["grad", "grad-recursive"], ns=[10], ks=[5], scales=[0.1, 100.0], trials=6)
    assert all(c.failures == 0 and not c.kinds for c in _cells(report, "grad"))
    assert all(c.max_error < 1e-12 for c in _cells(report, "grad"))
    small, large = _cells(report, "grad-recursive")
    assert small.failures == 0 and small.max_error < 1e-12
    assert large.failures == 6
    assert set(large.kinds) <= {"log0", "log-negative"} and sum(large.kinds.values()) == 6
    assert large.detection is not None and large.detection.broken == 6
    assert math.isnan(large.max_error)  # no trial returned weights
    assert report.failed
    grad_b, rec_b = report.boundaries
    assert grad_b.first_failing_scale is None and rec_b.first_failing_scale == 100.0


def test_detection_and_prediction_report_the_right_level_on_a_hand_built_case():
    # level-1 marginals of the two top entries are 1/2 (fine); at level 2 they saturate to
    # 1 - O(e^-60), so the argument of the log at level 3 rounds to 0
    x = np.array([[0.0, 0.0, -60.0, -120.0], [0.0, -50.0, -100.0, -150.0], [0.0, -1.0, -2.0, -3.0]])
    trace = st.trace_grad_recursive(x, 3)
    outlook = grad_recursive_outlook(x, 3)
    assert trace.failed_level.tolist() == [3, 2, -1]
    assert trace.kind.tolist()[:2] == ["log0", "log0"]
    assert outlook.predicted_level.tolist() == [3, 2, -1]
    assert outlook.saturation_level.tolist() == [3, 2, -1]
    assert trace.value_before[0] == pytest.approx(0.5)  # the entry's argument one level earlier
    assert outlook.min_complement[2] > 0.01 and outlook.digits_lost[2] < 3
    assert outlook.digits_lost[0] > 16


def test_outlook_handles_masks_batches_and_validates():
    x = np.array([[[0.0, -np.inf, -1.0, -2.0]], [[0.0, -40.0, -np.inf, -80.0]]])
    o = grad_recursive_outlook(x, 2)
    assert o.predicted_level.shape == (2,)
    assert o.predicted_level.tolist() == [-1, 2]
    assert o.min_complement[0] == pytest.approx(1 - np.exp(0) / np.exp([0.0, -1.0, -2.0]).sum())
    assert grad_recursive_outlook([1.0, 2.0], 1).predicted_level.tolist() == [-1]
    with pytest.raises(InvalidArgumentError, match="k must satisfy"):
        grad_recursive_outlook([1.0, 2.0], 3)


def test_prediction_agrees_with_observation_on_a_small_grid():
    report = stability_probe(
        methods=["grad-recursive"], ns=[10, 40], ks=[2, 5, 10], scales=parse_scales("1:100:5"), trials=10, seed=3
    )
    dets = [c.detection for c in report.cells]
    agree = sum(d.agreement for d in dets)
    total = sum(c.trials for c in report.cells)
    assert agree / total >= 0.95
    broken = sum(d.broken for d in dets)
    assert broken > 30  # the grid does reach the failure regime
    # the error-amplification model is never late by a level; usually exact
    assert sum(d.level_agreement for d in dets) / broken >= 0.6
    for b in report.boundaries:
        assert b.predicted_scale == b.first_breaking_scale
        if b.saturation_scale is not None and b.predicted_scale is not None:
            assert b.saturation_scale >= b.predicted_scale


def test_saturation_alone_does_not_explain_the_failure():
    # n = 100, k = 50, unit spread: no marginal is anywhere near 1, yet the recursion breaks
    report = stability_probe(methods=["grad-recursive"], ns=[100], ks=[50], scales=[1.0], trials=5, seed=1)
    d = report.cells[0].detection
    assert d.min_complement > 1e-3
    assert d.saturation_predicted == 0
    assert d.broken >= 4 and d.predicted >= 4


def test_deterministic_and_independent_of_the_rest_of_the_grid():
    kwargs = dict(methods=["thre-sigmoid", "grad-recursive"], ks=[2], scales=[1.0, 30.0], trials=4, seed=7)
    a = stability_probe(ns=[10], **kwargs)
    b = stability_probe(ns=[10, 20], **kwargs)
    cells_b = [c for c in b.cells if c.n == 10]
    assert [(c.method, c.failures, c.max_error) for c in a.cells] == [
        (c.method, c.failures, c.max_error) for c in cells_b
    ]
    assert np.array_equal(draw_scores(10, 4, dist="normal", seed=7), draw_scores(10, 4, dist="normal", seed=7))
    assert not np.array_equal(draw_scores(10, 4, dist="normal", seed=7), draw_scores(10, 4, dist="normal", seed=8))


@pytest.mark.parametrize("dist", ["normal", "uniform", "laplace", "student-t"])
def test_draws_are_standardised(dist):
    d = draw_scores(4000, 3, dist=dist, seed=0)
    assert abs(d.std() - 1.0) < 0.15


def test_threshold_methods_match_their_bisection_reference():
    report = stability_probe(
        methods=["thre-exp", "thre-sigmoid", "thre-laplace"], ns=[50], ks=[1, 5, 49], scales=[0.1, 10.0, 1e3],
        trials=3,
    )
    assert not report.failed
    assert max(c.max_error for c in report.cells) < 1e-12


def test_unclaimed_range_breaches_are_reported_not_failures():
    # weighted-softmax tends to 1.5 on the max for k = 2 at large spreads: it does not claim range
    report = stability_probe(methods=["weighted-softmax"], ns=[5], ks=[2], scales=[30.0], trials=4)
    cell = report.cells[0]
    assert cell.unclaimed.get("out-of-range", 0) > 0
    assert "out-of-range" not in cell.kinds


def test_order_violations_respect_ties_and_tolerance():
    z = np.array([[0.0, -1.0, -1.0, -2.0]] * 3)
    p = np.array([[0.9, 0.5, 0.6, 0.1], [0.9, 0.5, 0.5, 0.6], [0.9, 0.5, 0.5, 0.5 + 1e-12]])
    assert _order_violations(z, p, 1e-9).tolist() == [False, True, False]
    # the scores' part, computed once per unit, gives the same answer for any weights
    rng = np.random.default_rng(3)
    z = np.round(rng.normal(size=(50, 12)), 1)
    order = _score_order(z)
    for _ in range(5):
        p = np.round(rng.random(z.shape), 1)
        assert np.array_equal(_order_violations(z, p, 0.05, order), _order_violations(z, p, 0.05))


def test_bad_arguments_raise():
    with pytest.raises(InvalidArgumentError, match="unknown method"):
        stability_probe(methods=["nope"], ns=[5], ks=[1], scales=[1.0], trials=1)
    with pytest.raises(InvalidArgumentError, match="distribution"):
        stability_probe(dist="cauchy", ns=[5], ks=[1], scales=[1.0], trials=1)
    with pytest.raises(InvalidArgumentError, match="trials"):
        stability_probe(ns=[5], ks=[1], scales=[1.0], trials=0)
    with pytest.raises(InvalidArgumentError, match="n must"):
        stability_probe(ns=[0], ks=[1], scales=[1.0], trials=1)


def test_default_methods_are_registered():
    assert set(DEFAULT_METHODS) == {s.name for s in st.METHODS.values() if s.capabilities.probe_default}
    assert "hard" not in DEFAULT_METHODS and "grad-recursive" in DEFAULT_METHODS


# ---- the references themselves, against oracles -----------------------------------------


def _enumerated_grad(z, k):
    """GradTopK by enumerating the k-subsets (exact up to rounding), small n only."""
    from itertools import combinations

    import mpmath as mp

    n = len(z)
    subsets = list(combinations(range(n), k))
    weights = [mp.e ** mp.fsum(mp.mpf(float(z[i])) for i in s) for s in subsets]
    total = mp.fsum(weights)
    return np.array([float(mp.fsum(w for s, w in zip(subsets, weights) if i in s) / total) for i in range(n)])


def test_grad_reference_and_outlook_complements_match_enumeration():
    import mpmath as mp

    from topk_cli.references import esp_tables, esp_weights

    mp.mp.dps = 50
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 7)) * np.array([[0.3], [4.0], [60.0]])
    z = st.scaled_scores(x, 1)
    for k in (1, 3, 6):
        ref = esp_weights(esp_tables(z, k, 7), k)
        exact = np.array([_enumerated_grad(row, k) for row in z])
        assert np.abs(ref - exact).max() < 1e-14
    # min complement over levels < k is the level k-1 complement of the top entry
    o = grad_recursive_outlook(x, 4)
    exact3 = np.array([_enumerated_grad(row, 3) for row in z])
    assert np.allclose(o.min_complement, 1 - exact3.max(axis=1), rtol=1e-6, atol=1e-15)


def test_sequential_references_match_high_precision():
    import mpmath as mp

    from topk_cli.references import (
        ReferenceContext,
        extended_precision,
        iterative_definition,
        weighted_softmax_definition,
    )

    def _sequential_reference(method, z, k):
        definition = iterative_definition if method == "iterative" else weighted_softmax_definition
        return extended_precision(definition)(z, k, ReferenceContext(z, k))

    mp.mp.dps = 40
    z = st.scaled_scores(np.array([[0.3, -1.2, 2.5, 0.0, 1.1]]) * 3.0, 1)
    zs = [mp.mpf(float(v)) for v in z[0]]
    k = 3
    # weighted-softmax: p += (1 - p) e^z / sum((1 - p) e^z)
    p = [mp.mpf(0)] * 5
    for _ in range(k):
        w = [(1 - p[i]) * mp.e ** zs[i] for i in range(5)]
        p = [p[i] + w[i] / mp.fsum(w) for i in range(5)]
    ref, trusted = _sequential_reference("weighted-softmax", z, k)
    assert trusted[0] and np.abs(ref[0] - np.array([float(v) for v in p])).max() < 1e-15
    # iterative: d = z - min z; p += softmax((1 - p) d)
    d = [v - min(zs) for v in zs]
    p = [mp.mpf(0)] * 5
    for _ in range(k):
        e = [mp.e ** ((1 - p[i]) * d[i]) for i in range(5)]
        p = [p[i] + e[i] / mp.fsum(e) for i in range(5)]
    ref, trusted = _sequential_reference("iterative", z, k)
    assert trusted[0] and np.abs(ref[0] - np.array([float(v) for v in p])).max() < 1e-15


def test_threshold_reference_solves_the_threshold_equation():
    from topk_cli.references import ReferenceContext

    z = st.scaled_scores(np.random.default_rng(2).standard_normal((4, 30)) * 5.0, 1)
    for method in ("thre-exp", "thre-sigmoid", "thre-laplace"):
        p, trusted = st.METHODS[method].probe.compute(z, 7, ReferenceContext(z, 7))
        assert trusted.all()
        assert np.abs(p.sum(axis=1) - 7).max() < 1e-12
        assert ((p >= 0) & (p <= 1)).all()


def test_inaccurate_results_are_caught(monkeypatch):
    # a method whose weights are off by 1e-6 must be flagged "inaccurate", not pass silently
    import dataclasses

    import topk_cli.analysis.probe as probe

    real = probe.evaluate

    def skewed(x, k, method, *, tau=1.0):
        r = real(x, k, method, tau=tau)
        w = r.weights.copy()
        w[0, 0] += 1e-6
        return dataclasses.replace(r, weights=w)

    monkeypatch.setattr(probe, "evaluate", skewed)
    report = stability_probe(methods=["thre-sigmoid"], ns=[10], ks=[3], scales=[1.0], trials=3)
    cell = report.cells[0]
    assert cell.kinds == {"inaccurate": 1, "sum-error": 1} and cell.failures == 1
    assert cell.max_error == pytest.approx(1e-6, rel=1e-3)


def test_progress_reports_every_unit():
    calls = []
    stability_probe(methods=["thre-exp"], ns=[5, 8], ks=[2], scales=[1.0, 2.0, 3.0], trials=1,
                    progress=lambda done, total: calls.append((done, total)))
    assert calls == [(i, 6) for i in range(1, 7)]


def test_k_close_to_n_breaks_at_tiny_spread_and_is_predicted():
    # not "small variance is safe": with k = 0.9 n every marginal grows towards 1 along the levels
    report = stability_probe(methods=["grad-recursive"], ns=[100], ks=["0.9n"], scales=[1e-9], trials=3)
    d = report.cells[0].detection
    assert d.broken == 3 and d.predicted == 3
    assert d.saturation_predicted == 0 and d.min_complement > 0.05


# ---- arguments found by fuzzing: refused with one clear message, never a bare ValueError ----


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(ns=[float("nan")]), "n must be positive integers"),
        (dict(seed=-1), "seed must be an integer >= 0"),
        (dict(seed=1.5), "seed must be an integer >= 0"),
        (dict(tau="1"), "tau must be a finite number"),
        (dict(offset=None), "offset must be a finite number"),
        (dict(tolerance="x"), "tolerance must be a finite number"),
        (dict(methods=None), "methods must be a list"),
        (dict(scales=["1"]), "scales must be finite numbers"),
    ],
)
def test_bad_probe_arguments_are_invalid_argument_errors(kwargs, match):
    base = dict(methods=["thre-exp"], ns=[5], ks=[2], scales=[1.0], trials=2)
    with pytest.raises(InvalidArgumentError, match=match):
        stability_probe(**(base | kwargs))


def test_a_grid_too_large_for_memory_is_refused_with_its_size():
    # the GradTopK reference tables are (n + 1, trials, k + 1) extended floats: ~120 GiB here
    with pytest.raises(InvalidArgumentError, match=r"n=20000, k up to 10000 and 20 trials need about \d+(\.\d+)? GiB"):
        stability_probe(methods=["grad-recursive"], ns=[20000], ks=["0.5n"], scales=[1.0], trials=20)


def test_the_recursion_outlook_works_in_o_n_k_memory():
    # its leave-one-out tables were (2k, trials, k, k): 5.9 GiB for one vector at n = 1000, k = 500
    assert probe_memory(["grad-recursive"], 1000, 500, 1) < 64 * 1024**2
    with pytest.raises(InvalidArgumentError, match="GiB"):
        stability_probe(methods=["thre-exp"], ns=[5], ks=[2], scales=[1.0], trials=10**9)
    assert probe_memory(["grad", "thre-exp"], 1000, 50, 20) < MAX_PROBE_BYTES  # the default grid fits


def test_probe_overflowing_draws_are_refused_without_warnings():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InvalidArgumentError, match="overflows float64"):
            stability_probe(methods=["thre-exp"], ns=[4], ks=[2], scales=[1e308], trials=2, offset=1e308)


def test_shared_references_give_the_bits_of_fresh_ones() -> None:
    """A unit computes each reference once per k (and the sequential definitions' steps once);
    the shared results are bit for bit those of a fresh computation."""
    from topk_cli.analysis.probe_grid import draw_scores
    from topk_cli.references import ReferenceContext, f_sigmoid, threshold_bisection

    assert threshold_bisection(f_sigmoid) is threshold_bisection(f_sigmoid)
    assert st.METHODS["thre-sigmoid"].probe.compute is st.METHODS["ot-sinkhorn"].probe.compute
    z = st.scaled_scores(3.0 * draw_scores(40, 6, dist="normal", seed=1), 1)
    ctx = ReferenceContext(z, 7)
    for k in (7, 1, 3):
        for name in ("iterative", "weighted-softmax", "thre-sigmoid", "grad"):
            fn = st.METHODS[name].probe.compute
            shared, trusted = ctx.reference(fn, k)
            fresh, fresh_trusted = fn(z.copy(), k, ReferenceContext(z.copy(), k))
            assert np.array_equal(shared, fresh) and np.array_equal(trusted, fresh_trusted), (name, k)
            assert ctx.reference(fn, k)[0] is shared


def test_grad_reference_matches_subset_enumeration():
    """GradTopK's reference p_i = sum over k-subsets containing i of prod w / sum over k-subsets, by
    enumeration (n = 7, every k, with ties and a masked entry)."""
    import itertools

    from topk_cli.references import ReferenceContext, grad_reference

    rng = np.random.default_rng(11)
    z = rng.normal(size=(3, 7)) * np.array([[0.5], [3.0], [8.0]])
    z[1, 2] = z[1, 4]
    z[2, 5] = -np.inf
    z -= np.max(z, axis=1, keepdims=True)
    ctx = ReferenceContext(z, 7)
    for k in range(1, 8):
        ref, trusted = grad_reference(z, k, ctx)
        assert trusted.all()
        for row in range(3):
            w = [math.exp(v) for v in z[row]]
            subsets = list(itertools.combinations(range(7), k))
            total = math.fsum(math.prod(w[j] for j in s) for s in subsets)
            if total == 0.0:  # k > number of unmasked entries
                continue
            want = [math.fsum(math.prod(w[j] for j in s) for s in subsets if i in s) / total for i in range(7)]
            np.testing.assert_allclose(ref[row], want, rtol=1e-12, atol=1e-15)
