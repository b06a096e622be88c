"""``softtopk verify-properties -m FILE.py:FUNCTION [--reference METHOD] [--dtype ...]``: judging a
user's own operator.

The verdict table of the fixtures in ``tests/fixtures/user_ops/``: each seeded defect (``defect_*``)
is reported by the property named for it, the article's snippets (``article_*``) by theirs, and the
correct operators pass ``--strict --reference thre-sigmoid`` with no false alarm. The CLI runs
in-process on a reduced suite (``--trials 1 -k 2``, or a sample file) to keep CI fast.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import ROOT, SAMPLES, run_cli

from topk_cli.properties.user import ALWAYS_PROPERTIES, TOLERANCES, USER_PROPERTIES, round_to_dtype

FIX = ROOT / "tests" / "fixtures" / "user_ops"
REDUCED = ("--trials", "1", "-k", "2", "-j", "1")

torch = pytest.importorskip("torch")


def _verify(fixture: str, *args: str, fn: str = "soft_topk") -> tuple[int, dict[tuple[str, str], dict], str]:
    spec = f"{FIX / fixture}:{fn}"
    code, out, err = run_cli("verify-properties", "-m", spec, "--format", "json", *args)
    assert code in (0, 1), err
    doc = json.loads(out)
    rows = {(r["method"], r["property"]): r for r in doc["results"]}
    assert {m for m, _ in rows} == {spec}
    return code, {p: r for (_, p), r in rows.items()}, err


#: fixture -> the property that must report its defect (under --reference thre-sigmoid --strict).
DEFECTS = {
    "defect_torch_no_threshold_grad.py": "vjp-matches-reference",
    "defect_torch_inplace.py": "input-unchanged",
    "defect_torch_float32_internals.py": "matches-reference",
    "defect_torch_sum.py": "sum",
    "defect_torch_not_shift_invariant.py": "shift-invariant",
    "defect_torch_nondeterministic.py": "deterministic",
}


@pytest.mark.parametrize("fixture", sorted(DEFECTS))
def test_each_seeded_defect_is_reported_by_its_property(fixture: str) -> None:
    code, rows, err = _verify(fixture, "--reference", "thre-sigmoid", "--strict", *REDUCED)
    prop = DEFECTS[fixture]
    assert rows[prop]["holds"] is False, rows[prop]
    assert rows[prop]["expected"] is True  # claimed by thre-sigmoid, or by every user's operator
    cex = rows[prop]["counterexample"]
    assert cex is not None and cex["command"].startswith("softtopk compute -m ")
    assert code == 1
    assert f"failed {prop}" in err.splitlines()[-1] or any(f"failed {prop}" in line for line in err.splitlines())


def test_the_correct_pytorch_operator_passes_strict_with_no_false_alarm() -> None:
    code, rows, err = _verify("example_torch_thre_sigmoid.py", "--reference", "thre-sigmoid", "--strict", *REDUCED)
    claimed_failures = [p for p, r in rows.items() if r["expected"] and r["holds"] is False]
    assert claimed_failures == [] and code == 0, (claimed_failures, err)
    # every row of the user's operator is there, measured, with its worst (1e-15 off reads as such)
    for prop in USER_PROPERTIES:
        assert rows[prop]["holds"] is True, rows[prop]
    assert 0 <= rows["matches-reference"]["worst"] < 1e-12
    assert 0 <= rows["vjp-matches-reference"]["worst"] < 1e-9
    assert rows["matches-reference"]["tolerance"] == TOLERANCES["float64"][0]
    assert rows["monotone-strict"]["holds"] is True  # a tie within 8 ulps of 1 is saturation, not a violation


def test_the_full_default_suite_passes_strict_for_the_correct_pytorch_operator() -> None:
    code, rows, err = _verify("example_torch_thre_sigmoid.py", "--reference", "thre-sigmoid", "--strict", "--trials", "1", "-j", "1")
    assert code == 0, err
    assert rows["matches-reference"]["checked"] > 200  # the whole suite, real k included


def test_json_rows_shape_and_the_reference_s_claims() -> None:
    code, out, _err = run_cli(
        "verify-properties", "-m", f"{FIX / 'defect_torch_float32_internals.py'}:soft_topk", "--reference", "thre-sigmoid",
        "--format", "json", *REDUCED,
    )
    assert code == 0  # without --strict a violation is reported, not an exit code
    doc = json.loads(out)
    assert doc["reference"] == "thre-sigmoid" and doc["dtype"] == "float64"
    props = [r["property"] for r in doc["results"]]
    for prop in USER_PROPERTIES:
        assert props.count(prop) == 1
    for r in doc["results"]:
        assert {"method", "property", "expected", "holds", "worst", "counterexample"} <= set(r)
    mine = {r["property"]: r for r in doc["results"] if r["property"] in USER_PROPERTIES}
    cex = mine["matches-reference"]["counterexample"]
    assert set(cex) >= {"x", "k", "tau", "detail", "command"}
    assert mine["matches-reference"]["worst"] > 1e-8  # float32 accuracy, measured
    assert all(r["dtype"] == "float64" for r in mine.values())
    # the generic rows carry thre-sigmoid's claims (sum, monotone-strict, smooth C-infinity ...)
    generic = {r["property"]: r for r in doc["results"] if r["property"] not in USER_PROPERTIES}
    assert generic["sum"]["expected"] is True and generic["softmax-at-k1"]["expected"] is False
    assert generic["smooth"]["expected_smoothness"] == "C-infinity"


def test_without_reference_only_the_three_always_claimed_properties_can_fail_strict() -> None:
    code, rows, err = _verify("example_torch_thre_sigmoid.py", "--strict", *REDUCED)
    assert code == 0, err
    assert set(USER_PROPERTIES) & set(rows) == set(ALWAYS_PROPERTIES)
    claimed = {p for p, r in rows.items() if r["expected"]}
    assert claimed == set(ALWAYS_PROPERTIES)  # the operator itself claims nothing
    code, rows, err = _verify("defect_torch_inplace.py", "--strict", *REDUCED)
    assert code == 1 and rows["input-unchanged"]["holds"] is False
    assert "failed input-unchanged" in err


def test_bfloat16_rows_measure_the_operator_against_the_float64_reference_on_rounded_scores() -> None:
    code, rows, err = _verify("example_torch_thre_sigmoid.py", "--reference", "thre-sigmoid", "--dtype", "bfloat16",
                              "--strict", *REDUCED)
    assert code == 0, err
    tol_p, tol_g = TOLERANCES["bfloat16"]
    p, g, topk = rows["matches-reference"], rows["vjp-matches-reference"], rows["same-topk-set"]
    assert p["dtype"] == g["dtype"] == topk["dtype"] == "bfloat16"
    assert p["tolerance"] == tol_p and g["tolerance"] == tol_g
    assert 1e-4 < p["worst"] <= tol_p  # bfloat16's rounding of p is measured (2^-9 near 1), within tolerance
    assert topk["holds"] is True and topk["worst"] == 0.0 and topk["checked"] > 0
    assert rows["dtype-preserved"]["holds"] is True  # bfloat16 in, bfloat16 out (and float64, float32)
    # the generic suite stays in float64: its 1e-12 tolerances still hold
    assert rows["sum"]["holds"] is True


def test_bfloat16_table_names_the_dtype() -> None:
    code, out, err = run_cli("verify-properties", "-m", f"{FIX / 'example_torch_thre_sigmoid.py'}:soft_topk",
                             "--reference", "thre-sigmoid", "--dtype", "bfloat16", *REDUCED)
    assert code == 0, err
    flat = " ".join(out.split())  # the title holds the fixture's full path: it wraps where the path is long
    assert "scores in bfloat16" in flat and "same-topk-set" in flat and "tolerance" in flat


def test_the_tolerance_option_decides_the_verdict() -> None:
    code, rows, _err = _verify("example_torch_thre_sigmoid.py", "--reference", "thre-sigmoid", "--strict",
                              "--reference-tol", "1e-17", *REDUCED)
    worst = rows["matches-reference"]["worst"]
    if worst > 1e-17:  # a float64 bisection is rarely exact to the last bit on every row
        assert code == 1 and rows["matches-reference"]["holds"] is False
    else:
        assert code == 0
    assert rows["matches-reference"]["tolerance"] == 1e-17
    code, rows, _err = _verify("defect_torch_float32_internals.py", "--reference", "thre-sigmoid", "--strict",
                              "--reference-tol", "0.5", "--vjp-tol", "10", *REDUCED)
    assert rows["matches-reference"]["holds"] is True and rows["vjp-matches-reference"]["holds"] is True


@pytest.mark.parametrize(
    "args, message",
    [
        (["-m", "thre-laplace", "--reference", "thre-sigmoid"], "no user's operator"),
        (["-m", "thre-laplace", "--dtype", "bfloat16"], "no user's operator"),
        (["-m", f"{FIX / 'example_torch_thre_sigmoid.py'}:soft_topk", "--dtype", "float8"], "dtype must be one of"),
        (["-m", f"{FIX / 'example_torch_thre_sigmoid.py'}:soft_topk", "--reference", "nope"], "nope"),
        (["-m", f"{FIX / 'example_torch_thre_sigmoid.py'}:soft_topk", "--reference", "thre-sigmoid",
          "--reference-tol", "-1"], "tolerance"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args: list[str], message: str) -> None:
    code, out, err = run_cli("verify-properties", *args, "--trials", "1")
    assert code == 2 and out == ""
    assert message in err and "Traceback" not in err


# -- the article's snippets, as users would paste them (numpy, one vector at a time) -------------


def test_article_sigmoid_bisection_is_1e_5_off_and_fails_at_k_equal_n() -> None:
    code, rows, _err = _verify("article_thre_sigmoid_bisection.py", "--reference", "thre-sigmoid", "--strict",
                              "--values", "3,1,2,0.5,-1", "-j", "1")  # k = 1, 2, n - 1, n
    assert code == 1
    assert 1e-7 < rows["matches-reference"]["worst"] < 1e-3  # epsilon = 1e-4 on lambda
    assert rows["finite"]["holds"] is False  # k = n: sigmoid_inv(1) is infinite, lamb is never bound
    assert rows["vjp-matches-reference"]["holds"] is None  # numpy: no gradient
    assert "no gradient" in rows["vjp-matches-reference"]["detail"]
    assert rows["jacobian"]["holds"] is None  # nothing to compare finite differences with


def test_article_gradtopk_recursion_hits_log0_and_the_closed_forms_fail_where_they_are_crude() -> None:
    code, rows, _err = _verify("article_gradtopk.py", "--reference", "grad", "--strict", "--values", "0,50,100,20,70",
                              "--tau", "0.1", "-j", "1")  # a spread of 1000 in z: log Z_{k-1} - max log Z_{k-1,i} rounds to 0
    assert code == 1 and rows["finite"]["holds"] is False and rows["matches-reference"]["holds"] is False
    assert rows["dtype-preserved"]["holds"] is False  # float32 in, float64 out (np.log(np.arange(k) + 1) ...)
    code, rows, _err = _verify("article_thre_laplace.py", "--reference", "thre-laplace", *REDUCED)
    assert rows["matches-reference"]["holds"] is True  # where it returns finite weights, it is right
    assert rows["finite"]["holds"] is False  # exp(lse1 + lse2) overflows on a wide spread


# -- JAX -------------------------------------------------------------------------------------


def test_jax_operators_missing_threshold_term_caught_and_correct_one_passes() -> None:
    """JAX compiles once per shape and the generic suite has hundreds of shapes: the rows of the
    user's operator are checked here through the API, on the rows of one sample file."""
    jax = pytest.importorskip("jax")
    from topk_cli.frameworks.user import load_user_operator
    from topk_cli.properties import cases_from_vectors
    from topk_cli.properties.user import check_user_operator

    logits = np.loadtxt(SAMPLES / "router_logits.csv", delimiter=",", skiprows=1, usecols=range(1, 9))
    cases = cases_from_vectors(logits[np.isfinite(logits).all(axis=1)], 2, real_k=True)  # the defects do not mask
    verdicts = {}
    x64 = jax.config.jax_enable_x64  # the correct operator switches x64 on (for float64): restored after
    try:
        for name in ("correct_jax_thre_sigmoid.py", "defect_jax_no_threshold_grad.py", "defect_jax_float32_output.py"):
            op = load_user_operator(f"{FIX / name}:soft_topk")
            assert op.framework == "jax"
            verdicts[name] = {r.property: r for r in check_user_operator(op, cases, reference="thre-sigmoid")}
    finally:
        jax.config.update("jax_enable_x64", x64)
    good = verdicts["correct_jax_thre_sigmoid.py"]
    assert all(r.holds is True for r in good.values()), {p: (r.holds, r.worst, r.detail) for p, r in good.items()}
    assert good["matches-reference"].worst < 1e-12 and good["vjp-matches-reference"].checked == len(cases)
    assert verdicts["defect_jax_no_threshold_grad.py"]["vjp-matches-reference"].holds is False
    assert verdicts["defect_jax_no_threshold_grad.py"]["matches-reference"].holds is True  # the forward is right
    float32 = verdicts["defect_jax_float32_output.py"]
    assert float32["dtype-preserved"].holds is False and "float64 in, float32 out" in float32["dtype-preserved"].detail
    assert float32["matches-reference"].holds is False


# -- the dtype rounding ------------------------------------------------------------------------


def test_round_to_dtype_is_round_to_nearest_even_of_each_dtype() -> None:
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(2000) * 10.0 ** rng.integers(-8, 8, 2000), [0.0, -0.0, np.inf, -np.inf]])
    assert np.array_equal(round_to_dtype(x, "float32"), x.astype(np.float32).astype(np.float64))
    with np.errstate(over="ignore"):
        assert np.array_equal(round_to_dtype(x, "float16"), x.astype(np.float16).astype(np.float64))
    bf16 = torch.tensor(x.astype(np.float32)).to(torch.bfloat16).to(torch.float64).numpy()
    assert np.array_equal(round_to_dtype(x, "bfloat16"), bf16)
    assert round_to_dtype(np.array([1.0 + 2.0**-8]), "bfloat16")[0] == 1.0  # a tie goes to even
    assert round_to_dtype(np.array([1.0 + 3 * 2.0**-8]), "bfloat16")[0] == 1.0 + 2.0**-6
