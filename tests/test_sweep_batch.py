"""temperature-sweep on a batch measures every row (means over rows), and its CSV keeps everything."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
from conftest import SAMPLES, run_cli

import topk_cli as st
from topk_cli.analysis.sweep import temperature_sweep

ROUTER = SAMPLES / "router_logits.csv"


def _router() -> np.ndarray:
    rows = [line.split(",")[1:] for line in ROUTER.read_text().splitlines()[1:]]
    return np.array([[float(v) for v in r] for r in rows])


def test_a_batch_is_aggregated_over_every_row() -> None:
    x = _router()
    assert x.shape[0] > 1
    code, out, err = run_cli("temperature-sweep", str(ROUTER), "-k", "2", "-m", "grad", "--taus", "0.5,2", "--format", "json")
    assert code == 0
    assert "all 6 rows" in err and "mean" in err  # announced on stderr
    doc = json.loads(out)
    assert doc["rows"] == 6 and "mean over rows" in doc["aggregate"]
    assert np.array(doc["x"]).shape == x.shape
    for point in doc["results"]:
        p = st.soft_topk(x, 2, "grad", tau=point["tau"])
        hard = st.soft_topk(x, 2, "hard")
        assert point["topk_mass"] == pytest.approx(np.mean(np.sum(hard * p, axis=1)) / 2, abs=1e-12)
        assert point["l1_to_hard"] == pytest.approx(np.mean(np.abs(p - hard).sum(axis=1)), abs=1e-12)
        norms = [np.linalg.norm(j) for j in st.jacobian(x, 2, "grad", tau=point["tau"])]
        assert point["jacobian_norm"] == pytest.approx(np.mean(norms), rel=1e-12)
        assert point["failed_rows"] == 0
    (limit,) = doc["limits"]
    assert len(limit["limit"]) == 6 and limit["converges"] is True


def test_row_sweeps_one_row_and_a_single_vector_keeps_its_shapes() -> None:
    x = _router()
    code, out, err = run_cli("temperature-sweep", str(ROUTER), "-k", "2", "-m", "grad", "--taus", "1", "--row", "3", "--format", "json")
    assert code == 0 and "rows" not in err
    doc = json.loads(out)
    assert doc["x"] == [v if np.isfinite(v) else None for v in x[3]] and doc["aggregate"] is None
    assert isinstance(doc["limits"][0]["limit"][0], float)
    one = temperature_sweep(x[3], 2, methods=["grad"], taus=[1.0])
    assert doc["results"][0]["topk_mass"] == one.points[0].topk_mass


def test_failed_rows_are_counted_and_left_out() -> None:
    # grad-recursive fails (log 0) on the wide row only at small tau; the other row still counts
    x = np.array([[0.0, 50.0, 100.0], [0.0, 0.001, 0.002]])
    r = temperature_sweep(x, 2, methods=["grad-recursive"], taus=[0.01])
    (p,) = r.points
    assert p.failed_rows == 1 and p.status != "ok"
    alone = temperature_sweep(x[1], 2, methods=["grad-recursive"], taus=[0.01]).points[0]
    assert p.topk_mass == alone.topk_mass and p.l1_to_hard == alone.l1_to_hard


def test_csv_keeps_limits_matches_and_hardness() -> None:
    code, out, _ = run_cli(
        "temperature-sweep", "--values", "3,2,1,0", "-k", "2", "-m", "grad,hard", "--taus", "0.1,1",
        "--match", "0.9", "--hardness", "0.8", "--format", "csv",
    )
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    kinds = [(r["kind"], r["method"]) for r in rows]
    assert kinds.count(("point", "grad")) == 2 and kinds.count(("point", "hard")) == 2
    assert ("limit", "grad") in kinds and ("limit", "hard") in kinds
    assert ("match", "grad") in kinds and ("hardness", "grad") in kinds
    limit = next(r for r in rows if r["kind"] == "limit" and r["method"] == "grad")
    assert limit["converges"] == "True" and json.loads(limit["limit"]) == [1.0, 1.0, 0.0, 0.0]
    match = next(r for r in rows if r["kind"] == "match" and r["method"] == "grad")
    assert abs(float(match["topk_mass"]) - 0.9) <= 1e-9 and match["hardness_status"] == "ok"
    hard_match = next(r for r in rows if r["kind"] == "match" and r["method"] == "hard")
    assert hard_match["hardness_status"] == "constant" and hard_match["reason"]
