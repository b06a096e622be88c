"""One hardness solver, solved to float64 precision, behind every command that picks a tau by mass.

``compute --hardness H`` and ``temperature-sweep --match H`` / ``--hardness H`` ask the same
question (the largest tau at which the mean top-k mass is H) and must give the same answer; the
mass at that tau must equal H to float64 precision wherever the mass is continuous in tau.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import SAMPLES, run_cli

import topk_cli as st
from topk_cli.analysis.hardness import calibrate_hardness, topk_mass

#: Methods whose mean top-k mass is a continuous function of tau (perturbed's Monte Carlo
#: estimate is a step function of tau, weighted-softmax has poles, hard is constant).
CONTINUOUS = ["grad", "iterative", "thre-exp", "thre-sigmoid", "thre-laplace", "thre-clip", "thre-cube", "topk-softmax"]


def _mass(x: np.ndarray, k: int, method: str, tau: float) -> float:
    """Independent of the module: hard top-k by sorting (no ties in continuous data), every row ok."""
    r = st.evaluate(x, k, method, tau=tau)
    assert (np.asarray(r.status) == "ok").all()
    top = np.argsort(-x, axis=-1)[..., :k]
    mask = np.zeros_like(x)
    np.put_along_axis(mask, top, 1.0, axis=-1)
    return float(np.mean(np.sum(mask * r.weights, axis=-1)) / k)


@pytest.mark.parametrize("method", CONTINUOUS)
def test_mass_at_the_returned_tau_is_within_1e_9_of_the_target(method: str) -> None:
    x = np.random.default_rng(3).standard_normal((40, 12))
    targets = [0.6, 0.8, 0.95]
    checked = 0
    for h, m in zip(targets, calibrate_hardness(x, 3, method, targets), strict=True):
        if m.status == "unreachable":  # topk-softmax cannot be made soft enough for 0.6
            assert m.reason and method == "topk-softmax" and h == 0.6
            continue
        assert m.status == "ok", (method, h, m)
        assert m.tau is not None and m.mass is not None
        assert abs(m.mass - h) <= 1e-9, (method, h, m.mass - h)
        assert abs(_mass(x, 3, method, m.tau) - h) <= 1e-9
        checked += 1
    assert checked >= 2


def test_both_commands_report_the_same_tau() -> None:
    values = "3,2,1.5,1,0,-1"
    for method in ("grad", "thre-sigmoid", "iterative"):
        code, out, _ = run_cli("compute", "--values", values, "-k", "2", "-m", method, "--hardness", "0.9", "--format", "json")
        assert code == 0
        (run,) = json.loads(out)["results"]
        tau_compute = run["tau"]
        code, out, _ = run_cli(
            "temperature-sweep", "--values", values, "-k", "2", "-m", method, "--taus", "1",
            "--match", "0.9", "--hardness", "0.9", "--format", "json",
        )
        assert code == 0
        doc = json.loads(out)
        (match,) = doc["matches"]
        (at,) = doc["hardness"]
        assert match["tau"] == tau_compute == at["tau"], (method, match["tau"], tau_compute, at["tau"])
        assert abs(match["topk_mass"] - 0.9) <= 1e-9 and abs(run["topk_mass"] - 0.9) <= 1e-9


def test_both_commands_agree_on_a_batch_file() -> None:
    path = str(SAMPLES / "router_logits.csv")
    code, out, _ = run_cli("compute", path, "-k", "2", "-m", "grad", "--hardness", "0.85", "--format", "json")
    assert code == 0
    tau_compute = json.loads(out)["results"][0]["tau"]
    code, out, _ = run_cli("temperature-sweep", path, "-k", "2", "-m", "grad", "--taus", "1", "--match", "0.85", "--format", "json")
    assert code == 0
    assert json.loads(out)["matches"][0]["tau"] == tau_compute


def test_a_step_function_reports_the_step() -> None:
    # perturbed's estimate (fixed seed) is piecewise constant in tau: no tau gives 0.8 exactly,
    # the solver narrows the step to float64 resolution and keeps the mass just above.
    x = np.random.default_rng(3).standard_normal((10, 8))
    (m,) = calibrate_hardness(x, 2, "perturbed", [0.8], params={"samples": 100})
    assert m.status == "ok" and m.mass is not None and m.tau is not None
    assert 0.8 <= m.mass <= 0.8 + 5e-3
    if m.mass - 0.8 > 1e-9:
        assert "steps" in m.reason
        softer, _ = topk_mass(x, 2, "perturbed", m.tau * (1 + 1e-12), samples=100)
        assert softer is not None and softer < 0.8
