"""A user's own operator on the command line: every command takes ``-m FILE.py:FUNCTION``, names it as
written, keeps stdout one document whatever the function prints, reports what it does wrong, and
refuses a spec it cannot load with one line and exit code 2. Runs in-process (``run_cli``): torch
and JAX are imported once for the whole file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

OPS = Path(__file__).resolve().parent / "fixtures" / "user_ops"
TORCH = f"{OPS / 'ok_torch.py'}:thre_sigmoid"
JAX = f"{OPS / 'ok_jax.py'}:thre_sigmoid"
NUMPY = f"{OPS / 'ok_numpy_batched.py'}:thre_sigmoid"
ROWWISE = f"{OPS / 'ok_numpy_rowwise.py'}:thre_sigmoid"


def bad(function: str) -> str:
    return f"{OPS / 'bad_behaviour.py'}:{function}"


def test_compute_beside_a_builtin_names_the_operator_as_written():
    code, out, err = run_cli("compute", "-m", "thre-sigmoid", "-m", ROWWISE, "-k", "2", "--values", "3,2,1,4",
                             "--format", "json")
    assert code == 0
    results = json.loads(out)["results"]
    assert [r["method"] for r in results] == ["thre-sigmoid", ROWWISE]
    np.testing.assert_allclose(results[1]["weights"], results[0]["weights"], atol=1e-12)
    assert f"softtopk: note: {ROWWISE}: it is called row by row" in err


def test_printing_operator_keeps_stdout_one_json_document():
    code, out, err = run_cli("compute", "-m", bad("prints"), "-k", "2", "--values", "3,2,1,4", "--format", "json")
    assert code == 0
    assert json.loads(out)["results"][0]["status"] == ["ok"]
    assert "debug: computing top-k" not in out and "it printed on stdout" in err and "debug: computing top-k" in err


@pytest.mark.parametrize(("function", "code_seen", "text"), [
    ("raises", "exception", "RuntimeError: this operator always fails"),
    ("wrong_shape", "wrong-shape", "returned shape (1, 3) for an input of shape (1, 4)"),
])
def test_failing_operator_is_a_finding_with_exit_1(function, code_seen, text):
    code, out, err = run_cli("compute", "-m", bad(function), "-k", "2", "--values", "3,2,1,4", "--format", "json")
    assert code == 1 and "Traceback" not in err
    assert json.loads(out)["results"][0]["status"] == [code_seen]
    assert text in err


def test_warning_and_input_change_are_notes():
    code, _, err = run_cli("compute", "-m", bad("warns"), "-m", bad("modifies_input"), "-k", "2", "--values", "3,2,1,4")
    assert code == 0
    assert "it warned: UserWarning: this operator warns" in err
    assert "it modified its input array in place" in err


@pytest.mark.parametrize(("name", "expected"), [
    ("bad_syntax.py:thre", "bad_syntax.py:3: syntax error"),
    ("bad_import.py:thre", "bad_import.py:3: ModuleNotFoundError"),
    ("missing_file.py:f", "missing_file.py: no such file"),
    ("ok_torch.py:not_there", "no function 'not_there'"),
])
def test_bad_spec_is_one_line_and_exit_2(name, expected):
    code, out, err = run_cli("compute", "-m", str(OPS / name), "-k", "2", "--values", "3,2,1,4")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("softtopk: error: ") and expected in err


def test_framework_and_dtype_options():
    code, out, err = run_cli("compute", "-m", TORCH, "--dtype", "float32", "-k", "2", "--values", "3,2,1,4",
                             "--format", "json")
    assert code == 0
    weights = json.loads(out)["results"][0]["weights"][0]
    assert weights[0] == pytest.approx(0.6224593, abs=1e-6) and weights[0] != pytest.approx(0.6224593312018546, abs=1e-12)
    code, _, err = run_cli("compute", "-m", NUMPY, "--framework", "torch", "-k", "2", "--values", "3,2,1,4")
    assert code == 1 and "exception" in err  # numpy code run on tensors: a finding, not a crash
    code, _, _ = run_cli("compute", "-m", NUMPY, "-k", "2", "--values", "3,2,1,4")
    assert code == 0  # the next command detects its framework again (the forced one is not kept)
    code, _, err = run_cli("compute", "-m", "thre-sigmoid", "--dtype", "float32", "-k", "2", "--values", "3,2,1,4")
    assert code == 2 and "apply to your own operator" in err
    code, _, err = run_cli("compute", "-m", TORCH, "--framework", "mxnet", "-k", "2", "--values", "3,2,1,4")
    assert code == 2 and "--framework must be" in err


def test_numpy_operator_has_no_jacobian_in_compute():
    code, out, err = run_cli("compute", "-m", NUMPY, "-m", "thre-sigmoid", "--jacobian", "-k", "2",
                             "--values", "3,2,1,4", "--format", "json")
    assert code == 0
    first, second = json.loads(out)["results"]
    assert first["jacobian"] is None and "has no Jacobian" in first["jacobian_note"]
    assert second["jacobian"] is not None
    code, out, err = run_cli("compute", "-m", NUMPY, "-m", "thre-sigmoid", "--jacobian", "-k", "2", "--values", "3,2,1,4")
    assert code == 0 and "Jacobian d p_i / d x_j of thre-sigmoid" in out and f"{NUMPY} has no Jacobian" in err


@pytest.mark.parametrize("op", [TORCH, JAX], ids=["torch", "jax"])
def test_every_command_runs_a_framework_operator(op):
    tol = 1e-5  # JAX without x64 computes in float32
    code, out, _ = run_cli("compute", "-m", op, "-k", "2", "--values", "3,2,1,4", "--jacobian", "--format", "json")
    assert code == 0
    result = json.loads(out)["results"][0]
    assert result["weights"][0][0] == pytest.approx(0.6224593312018546, abs=tol) and result["jacobian"][0] is not None
    code, out, _ = run_cli("compute", "-m", op, "-k", "2", "--values", "3,2,1,4", "--hardness", "0.8", "--format", "json")
    assert code == 0 and json.loads(out)["results"][0]["topk_mass"] == pytest.approx(0.8, abs=1e-3)
    code, out, _ = run_cli("temperature-sweep", "-m", op, "-k", "2", "--taus", "0.1,1", "--format", "json")
    assert code == 0
    sweep = json.loads(out)
    assert {r["status"] for r in sweep["results"]} == {"ok"} and all(r["jacobian_norm"] for r in sweep["results"])
    assert sweep["limits"][0]["converges"] is True
    code, out, _ = run_cli("stability-probe", "-m", op, "-n", "6", "-k", "2", "--scales", "1,100", "--trials", "2",
                           "--format", "json")
    assert code == 0 and all(r["failures"] == 0 for r in json.loads(out)["results"])
    code, out, _ = run_cli("bench", "-m", op, "-k", "2", "-B", "8", "-n", "6", "--repeats", "1", "--no-memory",
                           "--format", "json")
    bench = json.loads(out)["results"][0]
    assert code == 0 and bench["vjp_ms"] is not None
    assert bench["operator_ms"] > 0 and bench["overhead_ms"] >= 0


def test_verify_properties_and_train_probe_run_a_torch_operator():
    # (a JAX operator too, but JAX compiles each operation once per input shape and runs the fixture's
    # bisection eagerly: 10 s and 7 s of CPU for these two, too much for every CI run)
    code, out, _ = run_cli("train-probe", "-m", TORCH, "--quick", "--steps", "5", "--format", "json")
    assert code == 0 and TORCH in out
    code, out, _ = run_cli("verify-properties", "-m", TORCH, "-k", "2", "--values", "3,2,1,4", "--trials", "1",
                           "--format", "json")
    assert code == 0
    rows = {r["property"]: r for r in json.loads(out)["results"]}
    assert rows["sum"]["holds"] is True and rows["sum"]["expected"] is False  # measured, never claimed
    assert rows["jacobian"]["holds"] is True  # its autodiff Jacobian against finite differences


def test_probe_reports_user_failure_kinds_with_their_message():
    code, out, _ = run_cli("stability-probe", "-m", bad("raises"), "-m", bad("returns_nan"), "-m", bad("wrong_shape"),
                           "-n", "6", "-k", "2", "--scales", "1", "--trials", "2", "--format", "json")
    assert code == 0
    by_method = {r["method"]: r for r in json.loads(out)["results"]}
    raised = by_method[bad("raises")]
    assert raised["kinds"] == {"exception": 2} and "this operator always fails" in raised["examples"]["exception"]
    assert by_method[bad("returns_nan")]["kinds"] == {"nan": 2}
    assert "returned nan at index" in by_method[bad("returns_nan")]["examples"]["nan"]
    assert by_method[bad("wrong_shape")]["kinds"] == {"wrong-shape": 2}


def test_probe_lists_sums_and_ranges_a_user_operator_does_not_claim():
    softmax_times_k = f"{OPS / 'ok_sibling.py'}:scaled_softmax"  # k softmax(x / tau): entries above 1
    code, out, _ = run_cli("stability-probe", "-m", softmax_times_k, "-n", "6", "-k", "2", "--scales", "100",
                           "--trials", "2", "--format", "json")
    assert code == 0
    result = json.loads(out)["results"][0]
    assert result["failures"] == 0 and result["unclaimed"] == {"out-of-range": 2}


def test_verify_properties_says_a_numpy_operator_has_no_jacobian():
    code, out, _ = run_cli("verify-properties", "-m", NUMPY, "-k", "2", "--values", "3,2,1,4", "--trials", "1",
                           "--format", "json")
    assert code == 0
    rows = {r["property"]: r for r in json.loads(out)["results"]}
    assert rows["jacobian"]["holds"] is None and "not available" in rows["jacobian"]["detail"]
    assert rows["range"]["holds"] is True and rows["range"]["expected"] is False


def test_numpy_operator_without_gradient_in_the_analyses():
    code, out, _ = run_cli("temperature-sweep", "-m", NUMPY, "-k", "2", "--taus", "0.1,1", "--format", "json")
    assert code == 0
    assert {r["jacobian_status"] for r in json.loads(out)["results"]} == {"not-available"}
    code, out, _ = run_cli("bench", "-m", NUMPY, "-k", "2", "-B", "8", "-n", "6", "--repeats", "1", "--no-memory",
                           "--format", "json")
    bench = json.loads(out)["results"][0]
    assert code == 0 and bench["vjp_ms"] is None and "no gradient" in bench["status"]
