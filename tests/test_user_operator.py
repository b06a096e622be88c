"""A user's own operator (``FILE.py:FUNCTION``, ``package.module:FUNCTION``, a callable) in the library:
loading, framework detection, guarded calls, gradients by autodiff, and the API treating it as a method.

The fixtures are in tests/fixtures/user_ops: ``ok_*`` compute threshold top-k with a sigmoid (the
same operator as ``thre-sigmoid``, so its answers are the reference), ``bad_*`` misbehave one way each.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import topk_cli as st
from topk_cli.errors import InvalidArgumentError, NumericalFailureError
from topk_cli.frameworks.user import UserOperatorError, load_user_operator
from topk_cli.registry import resolve

OPS = Path(__file__).resolve().parent / "fixtures" / "user_ops"
X = np.array([[1.0, 2.0, 3.0, 0.5], [0.0, -1.0, 4.0, 2.0], [0.3, 0.2, 0.1, 0.0]])


def spec(name: str) -> str:
    return f"{OPS / name.split(':')[0]}:{name.split(':')[1]}"


# ---- spec forms and loading ----------------------------------------------------------------------


def test_file_spec_absolute_and_relative_give_the_operator(monkeypatch):
    ref = st.soft_topk(X, 2, "thre-sigmoid", tau=0.7)
    np.testing.assert_allclose(st.soft_topk(X, 2, spec("ok_numpy_batched.py:thre_sigmoid"), tau=0.7), ref, atol=1e-12)
    monkeypatch.chdir(OPS)
    result = st.evaluate(X, 2, "ok_numpy_batched.py:thre_sigmoid", tau=0.7)
    assert result.method == "ok_numpy_batched.py:thre_sigmoid"  # named as written
    np.testing.assert_allclose(result.weights, ref, atol=1e-12)


def test_relative_path_is_resolved_from_the_current_folder(tmp_path, monkeypatch):
    for folder, factor in (("a", 1.0), ("b", 2.0)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "same_name_op.py").write_text(
            f"import numpy as np\ndef f(x, k, tau):\n    return np.full(x.shape, {factor} * k / x.shape[-1])\n"
        )
    monkeypatch.chdir(tmp_path / "a")
    assert st.soft_topk([1.0, 2.0], 1, "same_name_op.py:f")[0] == 0.5
    monkeypatch.chdir(tmp_path / "b")  # the same text names another file now
    assert st.soft_topk([1.0, 2.0], 1, "same_name_op.py:f")[0] == 1.0


def test_module_spec(tmp_path, monkeypatch):
    package = tmp_path / "userpkg_for_softtopk"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "ops.py").write_text("import numpy as np\ndef uniform(x, k, tau):\n    return np.full(x.shape, k / x.shape[-1])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = st.evaluate([3.0, 1.0, 2.0, 0.0], 2, "userpkg_for_softtopk.ops:uniform")
    assert result.method == "userpkg_for_softtopk.ops:uniform"
    np.testing.assert_array_equal(result.weights, [0.5, 0.5, 0.5, 0.5])


def test_callable_in_the_api():
    def softmax_k(x, k, tau):
        e = np.exp((x - x.max(axis=-1, keepdims=True)) / tau)
        return k * e / e.sum(axis=-1, keepdims=True)

    p = st.soft_topk([1.0, 2.0, 3.0], 1, softmax_k)
    np.testing.assert_allclose(p, st.soft_topk([1.0, 2.0, 3.0], 1, "topk-softmax"), atol=1e-12)
    assert resolve(softmax_k).name.endswith("softmax_k")


def test_sibling_module_imports():
    p = st.soft_topk([1.0, 2.0, 3.0], 1, spec("ok_sibling.py:scaled_softmax"))
    np.testing.assert_allclose(p.sum(), 1.0)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("bad_syntax.py:thre", r"bad_syntax\.py:3: syntax error"),
        ("bad_import.py:thre", r"bad_import\.py:3: ModuleNotFoundError: No module named 'a_module_that_does_not_exist_anywhere'"),
        ("no_such_file.py:f", r"no_such_file\.py: no such file"),
        ("ok_torch.py:missing", r"ok_torch\.py: no function 'missing' \(functions defined there: thre_sigmoid\)"),
    ],
)
def test_bad_specs_are_one_line_errors(name, expected):
    with pytest.raises(UserOperatorError, match=expected) as info:
        st.soft_topk([1.0, 2.0], 1, spec(name))
    assert "\n" not in str(info.value)
    assert isinstance(info.value, InvalidArgumentError)


def test_missing_module_is_one_line():
    with pytest.raises(UserOperatorError, match=r"no module named 'no_such_package_xyz'"):
        load_user_operator("no_such_package_xyz.ops:f")


def test_a_user_operator_claims_nothing():
    s = resolve(spec("ok_numpy_batched.py:thre_sigmoid"))
    assert not any(s.guarantees.as_dict().values())
    assert s.guarantees.smoothness == "discontinuous"  # the class that claims nothing
    assert not s.capabilities.jacobian and not s.capabilities.integer_k and not s.capabilities.probe_default
    assert resolve(spec("ok_torch.py:thre_sigmoid")).capabilities.jacobian


# ---- frameworks ------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "framework"), [
    ("ok_numpy_batched.py:thre_sigmoid", "numpy"), ("ok_torch.py:thre_sigmoid", "torch"),
    ("ok_jax.py:thre_sigmoid", "jax"),
])
def test_framework_is_detected(name, framework):
    assert load_user_operator(spec(name)).framework == framework


def test_framework_can_be_forced():
    op = load_user_operator(spec("ok_numpy_batched.py:thre_sigmoid"), framework="torch")
    result = op.call(X, 2, 1.0)
    assert result.error is not None and result.error[0] == "exception"  # numpy code on a tensor: a finding


def test_torch_operator_gradients_match_thre_sigmoid():
    name = spec("ok_torch.py:thre_sigmoid")
    v = np.arange(12.0).reshape(3, 4) - 5
    np.testing.assert_allclose(st.soft_topk(X, 2.5, name, tau=0.7), st.soft_topk(X, 2.5, "thre-sigmoid", tau=0.7), atol=1e-12)
    np.testing.assert_allclose(st.vjp(X, 2, v, name, tau=0.7), st.vjp(X, 2, v, "thre-sigmoid", tau=0.7), atol=1e-12)
    np.testing.assert_allclose(st.jacobian(X, 2, name, tau=0.7), st.jacobian(X, 2, "thre-sigmoid", tau=0.7), atol=1e-12)


def test_jax_operator_reports_the_dtype_it_returned():
    op = load_user_operator(spec("ok_jax.py:thre_sigmoid"))
    result = op.vjp(X, 2, 0.7, np.ones_like(X))
    assert result.error is None
    import jax

    expected = "float64" if jax.config.jax_enable_x64 else "float32"  # x64 off: float64 silently float32
    assert result.out_dtype == expected
    tol = 1e-12 if expected == "float64" else 1e-5
    np.testing.assert_allclose(result.p, st.soft_topk(X, 2, "thre-sigmoid", tau=0.7), atol=tol)
    np.testing.assert_allclose(st.jacobian(X, 2, spec("ok_jax.py:thre_sigmoid"), tau=0.7),
                               st.jacobian(X, 2, "thre-sigmoid", tau=0.7), atol=tol)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_dtypes_reach_the_function(dtype):
    seen = []

    def record(x, k, tau):
        seen.append(str(x.dtype))
        return np.full(x.shape, k / x.shape[-1], dtype=x.dtype)

    result = load_user_operator(record).call(X, 2, 1.0, dtype=dtype)
    assert set(seen) == {dtype} and result.out_dtype == dtype and result.error is None


def test_numpy_operator_has_no_gradient():
    name = spec("ok_numpy_batched.py:thre_sigmoid")
    result = load_user_operator(name).vjp(X, 2, 1.0, np.ones_like(X))
    assert result.error is not None and result.error[0] == "no-gradient" and result.vjp is None
    with pytest.raises(InvalidArgumentError, match="not available"):
        st.jacobian(X, 2, name)


def test_no_derivative_with_respect_to_tau():
    with pytest.raises(InvalidArgumentError, match=r"with respect to tau .* not available"):
        st.vjp(X, 2, np.ones_like(X), spec("ok_torch.py:thre_sigmoid"), wrt="tau")


# ---- one vector or a batch -------------------------------------------------------------------


def test_one_vector_function_is_called_row_by_row():
    op = load_user_operator(spec("ok_numpy_rowwise.py:thre_sigmoid"))
    result = op.call(X, 2, 0.7)
    assert op.row_by_row and "one vector" in op.row_reason
    np.testing.assert_allclose(result.p, st.soft_topk(X, 2, "thre-sigmoid", tau=0.7), atol=1e-12)
    batched = load_user_operator(spec("ok_numpy_batched.py:thre_sigmoid"))
    batched.call(X, 2, 0.7)
    assert not batched.row_by_row


def test_function_failing_on_a_batch_is_called_row_by_row():
    def one_row_only(x, k, tau):
        if x.ndim != 1:
            raise ValueError("expects a vector")
        e = np.exp(x / tau)
        return k * e / e.sum()

    op = load_user_operator(one_row_only)
    result = op.call(X, 1, 1.0)
    assert op.row_by_row and "fails on a (B, n) batch" in op.row_reason and result.error is None


def test_k_and_tau_per_row_reach_the_function():
    got = {}

    def record(x, k, tau):
        got["k"], got["tau"] = k, tau
        return np.full(x.shape, 1.0)

    st.evaluate(X, [1.0, 2.0, 2.5], record, tau=[1.0, 2.0, 3.0])
    assert np.asarray(got["k"]).shape == (3, 1) and np.asarray(got["tau"]).shape == (3, 1)
    st.evaluate(X, 2.5, record, tau=0.5)
    assert got["k"] == 2.5 and got["tau"] == 0.5  # a real k as given, not an array


# ---- misbehaviour is a finding, never an exception of softtopk --------------------------------


@pytest.mark.parametrize(("function", "kind", "message"), [
    ("raises", "exception", "RuntimeError: this operator always fails"),
    ("wrong_shape", "wrong-shape", "returned shape (3, 3) for an input of shape (3, 4)"),
    ("returns_list", "not-an-array", "returned builtins.list, not a numpy.ndarray"),
    ("returns_nan", "nan-inf", "returned nan"),
    ("integer_output", "wrong-dtype", "int64"),
])
def test_misbehaviour_is_reported(function, kind, message):
    result = load_user_operator(spec(f"bad_behaviour.py:{function}")).call(X, 2, 1.0)
    assert result.error is not None and result.error[0] == kind and message in result.error[1]


def test_api_reports_an_exception_per_row():
    result = st.evaluate(X, 2, spec("bad_behaviour.py:raises"))
    assert list(result.status) == ["exception"] * 3
    assert "this operator always fails" in result.failures[0].detail
    with pytest.raises(NumericalFailureError, match="exception"):
        st.soft_topk(X, 2, spec("bad_behaviour.py:raises"))


def test_printing_and_warnings_are_captured(capsys):
    op = load_user_operator(spec("bad_behaviour.py:prints"))
    result = op.call(X, 2, 1.0)
    assert "debug: computing top-k" in result.stdout and capsys.readouterr().out == ""
    warned = load_user_operator(spec("bad_behaviour.py:warns")).call(X, 2, 1.0)
    assert warned.warnings == ["UserWarning: this operator warns"] and warned.error is None


def test_input_modified_in_place_is_detected_and_the_callers_array_is_kept():
    x = X.copy()
    result = load_user_operator(spec("bad_behaviour.py:modifies_input")).call(x, 2, 1.0)
    assert result.input_changed
    np.testing.assert_array_equal(x, X)
    st.soft_topk(x, 2, spec("bad_behaviour.py:modifies_input"))
    np.testing.assert_array_equal(x, X)


def test_torch_misbehaviour():
    result = load_user_operator(spec("bad_torch.py:requires_grad")).call(X, 2, 1.0)
    assert result.requires_grad and result.error is None
    assert not load_user_operator(spec("ok_torch.py:thre_sigmoid")).call(X, 2, 1.0).requires_grad
    detached = load_user_operator(spec("bad_torch.py:detached")).vjp(X, 2, 1.0, np.ones_like(X))
    assert detached.error is not None and detached.error[0] == "no-gradient"
    changed = load_user_operator(spec("bad_torch.py:modifies_input")).call(X, 2, 1.0)
    assert changed.input_changed


def test_importing_topk_cli_and_a_numpy_operator_loads_no_framework():
    code = textwrap.dedent(f"""
        import sys, topk_cli
        topk_cli.soft_topk([1.0, 2.0, 3.0], 1, {spec('ok_numpy_batched.py:thre_sigmoid')!r})
        print(sorted({{m.split('.')[0] for m in sys.modules}} & {{'torch', 'jax'}}))
    """)
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"


def test_the_users_folder_does_not_shadow_libraries_after_import(tmp_path):
    (tmp_path / "colorsys.py").write_text("raise RuntimeError('the user folder shadowed a library')\n")
    (tmp_path / "op_beside_a_library_name.py").write_text(
        "import numpy as np\ndef f(x, k, tau):\n    return np.full(x.shape, k / x.shape[-1])\n"
    )
    sys.modules.pop("colorsys", None)
    st.soft_topk([1.0, 2.0], 1, f"{tmp_path / 'op_beside_a_library_name.py'}:f")
    import colorsys  # the standard library's, not the user's file (whose folder is now last on sys.path)

    assert colorsys.rgb_to_hsv(0.0, 0.0, 0.0) == (0.0, 0.0, 0.0)
