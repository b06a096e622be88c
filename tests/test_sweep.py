"""temperature_sweep: measurements, limits, tau grids and --match."""

from __future__ import annotations

import math

import numpy as np
import pytest

from topk_cli.analysis import temperature_sweep
from topk_cli.analysis.sweep import DEFAULT_SWEEP_VECTOR, limit_taus, parse_taus
from topk_cli.errors import InvalidArgumentError

X = [3.0, 2.0, 1.0, 0.0]


def test_parse_taus_ranges_and_lists() -> None:
    grid = parse_taus("1e-3:1e3:13")
    assert len(grid) == 13 and grid[0] == 1e-3 and grid[-1] == 1e3
    assert np.allclose(np.diff(np.log10(grid)), 0.5)
    assert parse_taus("0.01,0.1,1") == (0.01, 0.1, 1.0)
    assert parse_taus("2:2:1") == (2.0,)
    for bad in ("", "a:b:c", "1:10:0", "0,1", "-1", "1e-3:1e3"):
        with pytest.raises(InvalidArgumentError):
            parse_taus(bad)


def test_weighted_softmax_reports_its_true_limit_for_k2() -> None:
    r = temperature_sweep(X, 2, methods=["weighted-softmax", "thre-sigmoid"], taus=[1e-3, 1.0])
    ws, sig = r.limits
    assert ws.converges is False and ws.limit == (1.5, 0.5, 0.0, 0.0)
    assert sig.converges is True and sig.limit == (1.0, 1.0, 0.0, 0.0)
    at_small = next(p for p in r.points if p.method == "weighted-softmax" and p.tau == 1e-3)
    assert at_small.status == "ok" and at_small.l1_to_hard == pytest.approx(1.0, abs=1e-9)
    assert at_small.topk_mass == pytest.approx(1.0)  # all mass on the top two, wrongly split
    assert ws.uniform_at_infinity and ws.infinity_limit == (0.5, 0.5, 0.5, 0.5)


def test_measurements_of_hard_and_a_smooth_method() -> None:
    r = temperature_sweep(X, 2, methods=["hard", "grad"], taus=[1e-2, 1.0, 100.0])
    hard = [p for p in r.points if p.method == "hard"]
    assert all(p.l1_to_hard == 0 and p.jacobian_norm == 0 and p.small_gradient_fraction == 1 for p in hard)
    assert all(p.entropy == pytest.approx(math.log(2)) for p in hard)
    grad = [p for p in r.points if p.method == "grad"]
    l1 = [p.l1_to_hard for p in grad]
    assert l1[0] < l1[1] < l1[2]  # softer with tau
    assert grad[2].entropy == pytest.approx(math.log(4), abs=1e-3)
    assert grad[0].small_gradient_fraction == 1.0 and grad[1].small_gradient_fraction == 0.0
    assert all(p.max_entry_error <= p.l1_to_hard for p in grad)
    assert r.limits[0].uniform_at_infinity is False  # hard stays hard


def test_grad_recursive_failure_is_a_status_not_an_exception() -> None:
    r = temperature_sweep([0.0, 50.0, 100.0], 2, methods=["grad-recursive"], taus=[0.01, 100.0])
    assert r.points[0].status != "ok" and r.points[0].l1_to_hard is None
    assert r.points[1].status == "ok"
    assert r.limits[0].converges is None and r.limits[0].limit is None


def test_match_finds_equal_hardness() -> None:
    r = temperature_sweep(X, 2, methods=["thre-sigmoid", "grad", "hard"], taus=[1.0], match=0.9)
    by = {m.method: m for m in r.matches}
    for name in ("thre-sigmoid", "grad"):
        assert by[name].tau is not None and by[name].topk_mass == pytest.approx(0.9, abs=1e-6)
    assert by["hard"].tau is None


def test_limit_taus_follow_the_data() -> None:
    assert limit_taus(np.array([0.0, 1e-3, 5.0])) == pytest.approx((1e-7, 5e6))


def test_invalid_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match="k must satisfy"):
        temperature_sweep(X, 5)
    with pytest.raises(InvalidArgumentError, match="match"):
        temperature_sweep(X, 2, match=1.5)
    with pytest.raises(InvalidArgumentError):  # a vector or a batch of rows, nothing deeper
        temperature_sweep([[[1.0, 2.0]]], 1)
    with pytest.raises(ValueError, match="unknown method"):
        temperature_sweep(X, 2, methods=["nope"])
    assert len(DEFAULT_SWEEP_VECTOR) == 6
