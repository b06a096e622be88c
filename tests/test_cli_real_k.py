"""The CLI's k as models use it: a real ``-k``, ``--k-column NAME`` (one k per row from a column of
the input) and ``--axis columns`` (each column one vector), end to end through ``run_cli``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import SAMPLES, run_cli

import topk_cli as st
from topk_cli.registry import METHODS

CAPACITY = SAMPLES / "router_capacity.csv"
ROUTER = SAMPLES / "router_logits.csv"
SCORES = SAMPLES / "scores.csv"


def _real_k_method() -> str:
    takers = [name for name, spec in METHODS.items() if not spec.capabilities.integer_k and name != "hard"]
    assert takers, "the threshold methods take a real k (capabilities.integer_k False)"
    return "thre-sigmoid" if "thre-sigmoid" in takers else takers[0]


def _integer_only() -> str:
    names = [name for name, spec in METHODS.items() if spec.capabilities.integer_k]
    assert names, "the integer-only methods (grad, iterative, ...) are registered"
    return "grad" if "grad" in names else names[0]


def _capacity() -> tuple[np.ndarray, np.ndarray, list[str]]:
    lines = CAPACITY.read_text().splitlines()
    header = lines[0].split(",")
    rows = [line.split(",") for line in lines[1:]]
    x = np.array([[float(c) for c in row[1:-1]] for row in rows])
    k = np.array([float(row[-1]) for row in rows])
    return x, k, header


def _json_k(k: np.ndarray) -> list[int | float]:
    return [int(v) if v.is_integer() else v for v in k.tolist()]


# ---- --k-column ----------------------------------------------------------------------------


def test_k_column_json_equals_per_row_api_calls() -> None:
    x, k, _ = _capacity()
    assert len(set(k.tolist())) > 1, "the sample's capacities differ from row to row"
    assert not all(v.is_integer() for v in k.tolist()), "the sample has real capacities"
    r = run_cli("compute", "-m", "thre-sigmoid", "-m", "thre-laplace", "--k-column", "capacity", "--format", "json",
                CAPACITY)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["k"] == _json_k(k)
    assert doc["labels"] == [f"expert_{i}" for i in range(8)]  # the capacity column is not a score
    for result in doc["results"]:
        weights = np.array(result["weights"])
        assert weights.shape == x.shape
        for row in range(x.shape[0]):
            expected = st.soft_topk(x[row], k[row], method=result["method"])
            np.testing.assert_allclose(weights[row], expected, rtol=0, atol=1e-15)
            assert abs(weights[row].sum() - k[row]) < 1e-9


def test_integer_k_column_runs_integer_only_methods_row_by_row(tmp_path) -> None:
    path = tmp_path / "int.csv"
    path.write_text("t,a,b,c,d,kk\nx,1.5,2,3,0.5,1\ny,3,1,0.5,2.5,3\nz,0.25,1,2,4,2\n")
    r = run_cli("compute", "-m", "grad", "-m", "iterative", "--k-column", "kk", "--format", "json", path)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    x = np.array([[1.5, 2, 3, 0.5], [3, 1, 0.5, 2.5], [0.25, 1, 2, 4]])
    assert doc["k"] == [1, 3, 2]
    for result in doc["results"]:
        for row, k in enumerate((1, 3, 2)):
            expected = st.soft_topk(x[row], k, method=result["method"])
            np.testing.assert_allclose(result["weights"][row], expected, rtol=0, atol=1e-15)


def test_k_column_is_announced_on_one_stderr_line() -> None:
    r = run_cli("compute", "-m", "thre-sigmoid", "--k-column", "capacity", "--format", "json", CAPACITY)
    assert r.code == 0
    lines = [line for line in r.err.splitlines() if "capacity" in line]
    assert len(lines) == 1 and lines[0].startswith("softtopk: note: ") and "k per row from column 'capacity'" in lines[0]


def test_k_column_table_and_csv_show_each_rows_k() -> None:
    _, k, _ = _capacity()
    table = run_cli("compute", "-m", "thre-sigmoid", "--k-column", "capacity", CAPACITY)
    assert table.code == 0
    assert "k per row (1 to 3, column 'capacity')" in table.out
    assert "row 0 (The), k=1" in table.out and "row 5 (mat), k=3" in table.out
    csv_out = run_cli("compute", "-m", "thre-sigmoid", "--k-column", "capacity", "--format", "csv", CAPACITY)
    assert csv_out.code == 0
    header, *lines = csv_out.out.splitlines()
    assert header.split(",")[-1] == "k"
    ks = {int(line.split(",")[0]): float(line.split(",")[-1]) for line in lines}
    assert ks == {row: float(v) for row, v in enumerate(k)}


def test_uniform_k_column_renders_exactly_as_k(tmp_path) -> None:
    path = tmp_path / "uniform.csv"
    path.write_text("token,a,b,c,kk\nx,1.5,2,3,2\ny,3,1,0.5,2\n")
    same = tmp_path / "same.csv"
    same.write_text("token,a,b,c\nx,1.5,2,3\ny,3,1,0.5\n")
    for fmt in ("table", "csv", "json"):
        by_column = run_cli("compute", "-m", "thre-laplace", "--k-column", "kk", "--format", fmt, path)
        by_k = run_cli("compute", "-m", "thre-laplace", "-k", "2", "--format", fmt, same)
        assert by_column.code == by_k.code == 0
        assert by_column.out.replace("uniform.csv", "same.csv") == by_k.out, fmt


@pytest.mark.parametrize(
    ("content", "column", "expected"),
    [
        ("t,a,b,c,kk\nx,1,2,3,1\ny,1,2,3,abc\n", "kk", "line 3, column 'kk': --k-column 'kk': 'abc' is not a number"),
        ("t,a,b,c,kk\nx,1,2,3,1\ny,1,2,3,\n", "kk", "line 3, column 'kk': --k-column 'kk': empty or missing k"),
        ("t,a,b,c,kk\nx,1,2,3,1\ny,1,2,3,4\n", "kk", "line 3, column 'kk': k = '4' is out of range: each row's k must satisfy 0 < k <= 3"),
        ("t,a,b,c,kk\nx,1,-inf,3,3\ny,1,2,3,1\n", "kk", "line 2, column 'kk': k = '3' is out of range: each row's k must satisfy 0 < k <= 2"),
        ("t,a,b,c,kk\nx,1,2,3,0\n", "kk", "k = '0' is out of range"),
        ("t,a,b,c,kk\nx,1,2,3,1\n", "cap", "--k-column: no column 'cap'; columns: 't', 'a', 'b', 'c', 'kk'"),
        ("a,kk\n1,1\n2,1\n", "kk", "--k-column needs a batch"),
    ],
)
def test_k_column_errors_name_file_row_column_and_value(tmp_path, content, column, expected) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(content)
    r = run_cli("compute", "-m", "thre-laplace", "--k-column", column, path)
    assert r.code == 2
    assert r.err.count("\n") == 1 and "Traceback" not in r.err
    assert r.err.startswith(f"softtopk: error: {path}: ") and expected in r.err, r.err


def test_k_column_from_json_records(tmp_path) -> None:
    records = [{"a": 0.5, "b": 2.0, "c": 1.5, "cap": 1}, {"a": 3.0, "b": 2.5, "c": 0.25, "cap": 2}]
    path = tmp_path / "records.json"
    path.write_text(json.dumps(records))
    r = run_cli("compute", "-m", "thre-laplace", "--k-column", "cap", "--format", "json", path)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["k"] == [1, 2] and doc["labels"] == ["a", "b", "c"]
    x = np.array([[0.5, 2.0, 1.5], [3.0, 2.5, 0.25]])
    for row, k in enumerate((1, 2)):
        np.testing.assert_allclose(doc["results"][0]["weights"][row], st.soft_topk(x[row], k, method="thre-laplace"),
                                   rtol=0, atol=1e-15)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["-k", "2", "--k-column", "capacity", CAPACITY], "give -k K or --k-column NAME, not both"),
        (["--k-column", "capacity", "--values", "3,2,1"], "--k-column reads a column of an input file"),
        (["--k-column", "x", ROUTER.with_suffix(".json")], "has no named columns"),
        (["--k-column", "capacity", "--axis", "columns", CAPACITY], "--k-column gives one k per row"),
        ([CAPACITY], "Missing option '-k'"),
    ],
)
def test_k_column_refusals_are_one_line(args, expected) -> None:
    r = run_cli("compute", "-m", "thre-laplace", *args)
    assert r.code == 2 and expected in r.err and r.err.count("\n") == 1, r.err


def test_bench_takes_a_k_column() -> None:
    _, k, _ = _capacity()
    r = run_cli("bench", "-m", "thre-laplace", "--k-column", "capacity", "--repeats", "1", "--no-memory",
                "--format", "json", CAPACITY)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["k"] == _json_k(k) and doc["n"] == 8 and doc["batch"] == 6
    assert [res["status"] for res in doc["results"]] == ["ok"]


# ---- --axis columns -----------------------------------------------------------------------


def test_axis_columns_equals_the_transposed_file(tmp_path) -> None:
    lines = [line.split(",") for line in ROUTER.read_text().splitlines()]
    transposed = tmp_path / "by_expert.csv"
    transposed.write_text("\n".join(",".join(col) for col in zip(*lines, strict=True)) + "\n")
    by_axis = run_cli("compute", "-m", "thre-laplace", "-m", "grad", "-k", "2", "--axis", "columns",
                      "--format", "json", ROUTER)
    by_file = run_cli("compute", "-m", "thre-laplace", "-m", "grad", "-k", "2", "--format", "json", transposed)
    assert by_axis.code == by_file.code == 0, by_axis.err
    a, b = json.loads(by_axis.out), json.loads(by_file.out)
    assert a["rows"] == 8 and a["n"] == 6
    assert a["labels"] == ["The", "cat", "sat", "on", "the", "mat"]  # row names label the entries
    assert a["row_names"] == [f"expert_{i}" for i in range(8)]  # column names name the vectors
    for key in ("labels", "row_names", "hard", "results"):
        assert a[key] == b[key], key
    assert "--axis columns: read 8 vectors (one per column) of 6 entries" in by_axis.err


def test_axis_refusals() -> None:
    r = run_cli("compute", "-k", "1", "--axis", "diagonal", ROUTER)
    assert r.code == 2 and "--axis must be rows or columns, got 'diagonal'" in r.err
    r = run_cli("compute", "-k", "1", "--axis", "columns", SCORES)
    assert r.code == 2 and "--axis columns reads each column of a batch" in r.err and r.err.count("\n") == 1


# ---- real -k -------------------------------------------------------------------------------


def test_non_integer_k_with_an_integer_only_method_is_a_usage_error() -> None:
    name = _integer_only()
    takers = [m for m, spec in METHODS.items() if not spec.capabilities.integer_k]
    for command in (["compute", "--values", "3,2,1,0"], ["temperature-sweep", "--values", "3,2,1,0"],
                    ["bench", "-B", "2", "-n", "4"], ["verify-properties", "--values", "3,2,1,0"]):
        r = run_cli(*command, "-m", name, "-k", "2.5")
        assert r.code == 2, (command, r.err)
        assert r.err.count("\n") == 1 and "Traceback" not in r.err
        assert f"-k 2.5 is not an integer, and {name} takes an integer k only" in r.err
        assert f"methods that accept a real k: {', '.join(takers) if takers else 'none'}" in r.err


def test_k_column_with_a_real_k_and_an_integer_only_method_names_the_row(tmp_path) -> None:
    path = tmp_path / "real.csv"
    path.write_text("t,a,b,c,kk\nx,1,2,3,1\ny,1,2,3,1.5\n")
    r = run_cli("compute", "-m", _integer_only(), "--k-column", "kk", path)
    assert r.code == 2 and r.err.splitlines()[-1].startswith("softtopk: error: k = 1.5 (--k-column 'kk',")
    assert "row 1, 0-based" in r.err


def test_integer_valued_real_k_is_an_integer() -> None:
    a = run_cli("compute", "-m", "grad", "-k", "2.0", "--format", "json", "--values", "3,2,1,0")
    b = run_cli("compute", "-m", "grad", "-k", "2", "--format", "json", "--values", "3,2,1,0")
    assert a.code == b.code == 0 and a.out == b.out and json.loads(a.out)["k"] == 2


@pytest.mark.parametrize("value", ["abc", "nan", "inf"])
def test_k_must_be_a_finite_number(value: str) -> None:
    r = run_cli("compute", "-k", value, "--values", "3,2,1")
    assert r.code == 2 and r.err.count("\n") == 1 and "-k must be a" in r.err


def test_real_k_compute_equals_the_api() -> None:
    name = _real_k_method()
    r = run_cli("compute", "-m", name, "-k", "2.5", "--format", "json", "--values", "3,2,1,0,-1")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["k"] == 2.5
    expected = st.soft_topk(np.array([3.0, 2, 1, 0, -1]), 2.5, method=name)
    np.testing.assert_allclose(doc["results"][0]["weights"][0], expected, rtol=0, atol=1e-15)


def test_real_k_with_all_methods_skips_the_integer_only_ones() -> None:
    _real_k_method()
    r = run_cli("compute", "-m", "all", "-k", "2.5", "--format", "json", "--values", "3,2,1,0,-1")
    assert r.code == 0, r.err
    ran = [res["method"] for res in json.loads(r.out)["results"]]
    assert ran == [m for m, spec in METHODS.items() if not spec.capabilities.integer_k]
    skipped = [m for m, spec in METHODS.items() if spec.capabilities.integer_k]
    assert f"skipped {', '.join(skipped)}" in r.err


def test_real_k_on_every_command() -> None:
    name = _real_k_method()
    for command in (["temperature-sweep", "--values", "3,2,1,0", "--taus", "0.1,1"],
                    ["bench", "-B", "4", "-n", "8", "--repeats", "1", "--no-memory"]):
        r = run_cli(*command, "-m", name, "-k", "2.5", "--format", "json")
        assert r.code in (0, 1), (command, r.err)
        assert json.loads(r.out)


def test_stability_probe_reads_real_k_values() -> None:
    name = _integer_only()
    r = run_cli("stability-probe", "-m", name, "-n", "10", "-k", "1,1.5", "--trials", "2", "--scales", "1")
    assert r.code == 2 and r.err.count("\n") == 1
    assert f"-k 1.5 is not an integer, and {name} takes an integer k only" in r.err
    r = run_cli("stability-probe", "-m", name, "-n", "10", "-k", "2.0", "--trials", "2", "--scales", "1", "--format", "json")
    assert r.code == 0, r.err
    assert {cell["k"] for cell in json.loads(r.out)["results"]} == {2}
    r = run_cli("stability-probe", "-m", name, "-n", "10", "-k", "-1.5", "--trials", "2", "--scales", "1")
    assert r.code == 2 and "k must be a number > 0" in r.err


def test_real_k_stability_probe_runs_the_methods_that_take_it() -> None:
    name = _real_k_method()
    r = run_cli("stability-probe", "-n", "10", "-k", "2.5", "--trials", "2", "--scales", "1", "--format", "json",
                "--jobs", "1")
    assert r.code in (0, 1), r.err
    ran = {cell["method"] for cell in json.loads(r.out)["results"]}
    assert name in ran and not ran & {m for m, spec in METHODS.items() if spec.capabilities.integer_k}
    assert "skipped" in r.err


def test_hardness_with_a_k_per_row_divides_each_row_by_its_own_k() -> None:
    from topk_cli.operators.hard import hard_topk_weights

    x, k, _ = _capacity()
    r = run_cli("compute", "-m", "thre-laplace", "-m", "thre-sigmoid", "--hardness", "0.8", "--k-column", "capacity",
                "--format", "json", CAPACITY)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    h = np.stack([hard_topk_weights(x[row], k[row]) for row in range(len(k))])
    norm = np.floor(k) + (k - np.floor(k)) ** 2  # sum h^2 of each row's real-k hard selection
    for result in doc["results"]:
        assert result["hardness_status"] == "ok"
        p = st.soft_topk(x, k, method=result["method"], tau=result["tau"])
        mass = float(np.mean(np.sum(h * p, axis=-1) / norm))
        assert mass == pytest.approx(0.8, abs=1e-8) and result["topk_mass"] == pytest.approx(mass, abs=1e-12)


def test_top_k_mass_of_a_real_k_is_one_at_the_hard_selection() -> None:
    from topk_cli.analysis.hardness import mean_topk_mass, selection_norm, uniform_mass
    from topk_cli.operators.hard import hard_topk_weights

    x = np.array([[3.0, 2.0, 1.0, 0.0, -1.0], [0.5, 4.0, -2.0, 1.0, 3.0]])
    for k in (0.5, 1.5, 2.5, 3.75):
        h = hard_topk_weights(x, k)
        assert mean_topk_mass(h, h, k) == pytest.approx(1.0, abs=1e-15)
        assert selection_norm(k) == pytest.approx(float(np.sum(h[0] ** 2)), abs=1e-15)
        uniform = np.full_like(x, k / x.shape[1])
        assert uniform_mass(x, k) == pytest.approx(mean_topk_mass(h, uniform, k), abs=1e-15)
    # an integer k: exactly the integer formula, bit for bit
    rng = np.random.default_rng(0)
    p = rng.random(x.shape)
    h = hard_topk_weights(x, 2)
    assert mean_topk_mass(h, p, 2) == float(np.mean(np.sum(h * p, axis=-1)) / 2)
    assert mean_topk_mass(h, p, 2.0) == float(np.mean(np.sum(h * p, axis=-1)) / 2)


def test_a_negative_real_k_is_out_of_range_not_a_method_question() -> None:
    r = run_cli("compute", "-m", "grad", "-k", "-1.5", "--values", "3,2,1")
    assert r.code == 2 and "-k must satisfy 0 < k <= n for a real k, got -1.5" in r.err and r.err.count("\n") == 1


def test_temperature_sweep_k_column_measures_each_row_at_its_own_k() -> None:
    from topk_cli.operators.hard import hard_topk_weights

    x, k, _ = _capacity()
    r = run_cli("temperature-sweep", "-m", "thre-laplace", "--k-column", "capacity", "--taus", "0.5,2",
                "--format", "json", CAPACITY)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["k"] == _json_k(k)
    points = [p for p in doc["results"] if p["method"] == "thre-laplace"]
    assert [p["tau"] for p in points] == [0.5, 2.0]
    for point in points:
        masses = []
        for row in range(len(k)):
            p = st.soft_topk(x[row], k[row], method="thre-laplace", tau=point["tau"])
            norm = np.floor(k[row]) + (k[row] - np.floor(k[row])) ** 2
            masses.append(float(np.sum(hard_topk_weights(x[row], k[row]) * p)) / norm)
        assert point["topk_mass"] == pytest.approx(float(np.mean(masses)), abs=1e-12)
    one = run_cli("temperature-sweep", "-m", "thre-laplace", "--k-column", "capacity", "--row", "5", "--taus", "1",
                  "--format", "json", CAPACITY)
    assert one.code == 0 and json.loads(one.out)["k"] == 3


def test_bench_reads_by_column() -> None:
    r = run_cli("bench", "-m", "thre-laplace", "-k", "2", "--axis", "columns", "--repeats", "1", "--no-memory",
                "--format", "json", ROUTER)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert (doc["batch"], doc["n"], doc["k"]) == (8, 6, 2)
    r = run_cli("bench", "-m", "thre-laplace", "-k", "2", "--axis", "columns", "-B", "3", "-n", "4")
    assert r.code == 2 and "--axis columns reads the columns of INPUT" in r.err


def test_k_column_from_records_holding_a_list(tmp_path) -> None:
    records = [{"token": "a", "logits": [1.0, 2.0, 3.5], "cap": 1}, {"token": "b", "logits": [0.5, 2.0, 1.0], "cap": 2}]
    path = tmp_path / "router.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    r = run_cli("compute", "-m", "thre-laplace", "--k-column", "cap", "--format", "json", path)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["k"] == [1, 2] and doc["row_names"] == ["a", "b"] and doc["n"] == 3
    for row, rec in enumerate(records):
        np.testing.assert_allclose(doc["results"][0]["weights"][row],
                                   st.soft_topk(np.array(rec["logits"]), rec["cap"], method="thre-laplace"), rtol=0, atol=1e-15)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{**records[0], "cap": 4}, records[1]]))
    r = run_cli("compute", "-m", "thre-laplace", "--k-column", "cap", bad)
    assert r.code == 2 and r.err.count("\n") == 1
    assert "record [0], key 'cap': k = 4 is out of range: each row's k must satisfy 0 < k <= 3" in r.err


def test_several_inputs_with_a_k_column(tmp_path) -> None:
    uniform = tmp_path / "uniform.csv"
    uniform.write_text("token,a,b,c,capacity\nx,1.5,2,3,2\ny,3,1,0.5,2\n")
    r = run_cli("compute", "-m", "thre-laplace", "--k-column", "capacity", "--format", "csv", CAPACITY, uniform)
    assert r.code == 0, r.err
    header, *lines = r.out.splitlines()
    assert header.split(",")[0] == "source" and header.split(",")[-1] == "k"
    assert all(len(line.split(",")) == len(header.split(",")) for line in lines)
    assert {line.split(",")[-1] for line in lines if line.startswith(str(uniform))} == {"2"}
    r = run_cli("compute", "-m", "thre-laplace", "--k-column", "capacity", "--format", "json", CAPACITY, uniform)
    doc = json.loads(r.out)
    assert doc["k"] is None and doc["inputs"][0]["k"] == [1, 2, 1.5, 2.5, 2, 3] and doc["inputs"][1]["k"] == 2


def test_several_inputs_csv_header_names_every_column() -> None:
    # the header of several inputs is the parts' own (it named only the base columns, without --sum's)
    r = run_cli("compute", "-m", "thre-laplace", "-k", "2", "--sum", "--format", "csv", SCORES, ROUTER)
    assert r.code == 0, r.err
    header, *lines = r.out.splitlines()
    assert header.split(",")[-2:] == ["topk_sum", "potential"]
    assert all(len(line.split(",")) == len(header.split(",")) for line in lines if "," in line)
