"""The alias ``softmax`` names ``k-softmax`` at k = 1 only: at any other k the API and the CLI refuse
it in one line that names ``k-softmax`` (it silently gave ``k * softmax`` before)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_cli

import topk_cli as st
from topk_cli.registry import K_ONE_ALIASES, METHODS

X = np.array([0.3, -1.2, 2.0, 0.7])
SOFTMAX = np.exp(X - X.max()) / np.exp(X - X.max()).sum()


def test_softmax_at_k1_is_softmax_and_k_softmax_takes_any_k() -> None:
    np.testing.assert_allclose(st.soft_topk(X, 1, "softmax"), SOFTMAX, rtol=1e-15)
    np.testing.assert_allclose(st.soft_topk(X, 3, "k-softmax"), 3 * SOFTMAX, rtol=1e-15)
    rows = np.stack([X, X[::-1]])
    np.testing.assert_allclose(st.soft_topk(rows, np.array([1, 1]), "softmax"), st.soft_topk(rows, 1, "k-softmax"))


@pytest.mark.parametrize("call", [
    lambda: st.soft_topk(X, 2, "softmax"),
    lambda: st.evaluate(X, 3, "softmax"),
    lambda: st.jacobian(X, 2, "softmax"),
    lambda: st.vjp(X, 2, np.ones(4), "softmax"),
    lambda: st.soft_topk(np.stack([X, X]), np.array([1, 2]), "softmax"),  # one row at k = 2
])
def test_the_api_refuses_softmax_at_k_other_than_1(call) -> None:
    with pytest.raises(st.InvalidArgumentError, match=r"'softmax' is softmax, defined for k = 1 only .*got k=2|k=3"):
        call()


def test_the_restriction_is_declared_on_the_alias() -> None:
    assert K_ONE_ALIASES == {"softmax"}
    assert next(a for a in METHODS["k-softmax"].aliases if a.name == "softmax").k_one
    assert "k = 1 only" in METHODS["k-softmax"].notes


def test_the_cli_refuses_softmax_at_k2_in_one_line() -> None:
    code, out, err = run_cli("compute", "-m", "softmax", "-k", "2", "--values=0.3,-1.2,2,0.7")
    assert code == 2 and not out
    assert err.strip().splitlines() == [
        "softtopk: error: method 'softmax' is softmax, defined for k = 1 only (got k=2); use 'k-softmax' for k * softmax"
    ]
    code, _, err = run_cli("compute", "-m", "thre-exp,softmax", "-k", "2", "--values=0.3,-1.2,2,0.7")
    assert code == 2 and "'k-softmax'" in err
    code, out, _ = run_cli("compute", "-m", "softmax", "-k", "1", "--values=0.3,-1.2,2,0.7", "--format", "json")
    assert code == 0 and out
    code, out, _ = run_cli("compute", "-m", "k-softmax", "-k", "2", "--values=0.3,-1.2,2,0.7")
    assert code == 0 and out


def test_the_cli_refuses_softmax_where_a_command_runs_other_k(tmp_path) -> None:
    path = tmp_path / "k.csv"
    path.write_text("a,b,c,kk\n1,2,3,1\n3,1,0.5,2\n")
    code, _, err = run_cli("compute", "-m", "softmax", "--k-column", "kk", path)
    assert code == 2 and "got k=2" in err
    ones = tmp_path / "ones.csv"
    ones.write_text("a,b,c,kk\n1,2,3,1\n3,1,0.5,1\n")
    code, _, err = run_cli("compute", "-m", "softmax", "--k-column", "kk", ones)
    assert code == 0, err
    code, _, err = run_cli("verify-properties", "-m", "softmax")  # every k of the suite
    assert code == 2 and "k other than 1" in err
    code, _, err = run_cli("stability-probe", "-m", "softmax", "-k", "1,2", "-n", "5")
    assert code == 2 and "got k=2" in err
    code, _, err = run_cli("bench", "-m", "softmax", "-k", "3", "--values=1,2,3")
    assert code == 2 and "got k=3" in err
