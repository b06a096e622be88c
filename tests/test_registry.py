"""The registry is the one place that knows a method: fields, parameters, aliases, potentials.

Also: no module outside the registry and the operators tests a method's name, and a toy method
registered in a test runs through the API, the probe and ``compute`` with nothing else edited.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from types import MappingProxyType

import numpy as np
import pytest
from conftest import CliResult, run_cli

import topk_cli as st
import topk_cli.registry as registry
from topk_cli.errors import InvalidArgumentError, UnknownMethodError
from topk_cli.operators._base import Forward, Implementation
from topk_cli.operators.threshold import threshold_jacobian, threshold_vjp
from topk_cli.references import ReferenceContext, threshold_bisection
from topk_cli.registry import (
    ALIASES,
    METHODS,
    Capabilities,
    Evaluation,
    FailureCode,
    MethodSpec,
    ParamSpec,
    ProbeReference,
)

PACKAGE = Path(st.__file__).parent

#: String literals that equal a method name but are not about a method: output column names
#: (the hard top-k column of ``compute`` and ``temperature-sweep``). Each entry: file, string.
#: Family names that equal a method's name (the registry's ``family``: "iterative", "perturbed")
#: key the plot looks per family.
#: The drop-ins' default method and the one that takes a straight-through gradient are part of
#: their public signature; their bench's "softmax" is the framework's own softmax (a baseline row).
NOT_A_METHOD = {
    ("render/compute.py", "hard"), ("render/sweep.py", "hard"),
    ("render/styles.py", "iterative"), ("render/styles.py", "perturbed"),
    ("frameworks/dropin_common.py", "thre-laplace"), ("frameworks/dropin_common.py", "hard"),
    ("frameworks/dropin_bench.py", "softmax"),
}


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def test_no_module_outside_the_registry_names_a_method() -> None:
    names = set(METHODS) | set(ALIASES)
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        # catalog.py: the registry's numpy-free index of names, checked against it when the registry loads;
        # xp/: the array-API kernels of the drop-ins name the methods they compute, as operators/ do
        # (test_the_dropin_methods_are_registered checks those names against the registry)
        if rel in ("registry.py", "catalog.py") or rel.startswith(("operators/", "xp/")):
            continue
        tree = ast.parse(path.read_text())
        docs = _docstring_nodes(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                if node.value in names and (rel, node.value) not in NOT_A_METHOD:
                    found.append(f"{rel}:{node.lineno}: {node.value!r}")
    assert not found, "method names outside the registry (derive from METHODS instead):\n" + "\n".join(found)


def test_the_dropin_methods_are_registered() -> None:
    from topk_cli import xp

    assert xp.DROPIN_METHODS and set(xp.DROPIN_METHODS) <= set(METHODS)
    assert set(xp.REAL_K_METHODS) <= set(xp.DROPIN_METHODS)
    for name in xp.REAL_K_METHODS:
        assert not METHODS[name].capabilities.integer_k, name  # the drop-ins take a real k where the engine does
    for name in set(xp.DROPIN_METHODS) - set(xp.REAL_K_METHODS):
        assert METHODS[name].capabilities.integer_k, name


def test_the_name_check_can_fail(tmp_path: Path) -> None:
    tree = ast.parse('def f(m):\n    """Doc naming "grad"."""\n    return m == "grad-recursive"\n')
    docs = _docstring_nodes(tree)
    hits = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in METHODS and id(n) not in docs]
    assert hits == ["grad-recursive"]


def test_implementation_is_required() -> None:
    with pytest.raises(TypeError, match="implementation"):
        MethodSpec(  # type: ignore[call-arg]
            name="x", summary="s", family="f", guarantees=METHODS["grad"].guarantees, reference="r"
        )


def test_every_entry_is_complete() -> None:
    for spec in METHODS.values():
        assert spec.summary and spec.family and spec.reference and spec.probe.description
        assert isinstance(spec.implementation, Implementation)
        assert spec.guarantees.smoothness in registry.SMOOTHNESS_CLASSES
        assert spec.stable_equivalent is None or spec.stable_equivalent in METHODS
        for param in spec.parameters:
            assert param.name.isidentifier() and param.help
            assert param.validate(param.default, spec.name) == param.default
        if spec.capabilities.monte_carlo:
            assert spec.parameters, f"{spec.name}: a Monte-Carlo method takes samples and a seed"


def test_aliases_resolve_with_their_reference() -> None:
    assert ALIASES == {"simple": "grad", "lml": "thre-sigmoid", "lapsum": "thre-laplace"} | {
        a: m for a, m in ALIASES.items() if m not in ("grad", "thre-sigmoid", "thre-laplace")
    }
    for alias, name in ALIASES.items():
        assert st.get_method(alias).name == name
        spec_alias = next(a for a in METHODS[name].aliases if a.name == alias)
        ref = spec_alias.reference
        assert ref and any(ch.isdigit() for ch in ref)  # cites a year
        x = [0.3, -1.0, 2.0, 0.5]
        k = 1 if spec_alias.k_one else 2  # an alias of the method at k = 1 only (softmax) is refused at 2
        np.testing.assert_array_equal(st.soft_topk(x, k, alias), st.soft_topk(x, k, name))
        assert st.evaluate(x, k, alias).method == name


@pytest.mark.parametrize(("typed", "meant"), [("Grad", "grad"), ("thre_sigmoid", "thre-sigmoid"), ("LAPSUM", "lapsum"),
                                              ("thre-sigmod", "thre-sigmoid")])
def test_unknown_names_suggest_the_closest(typed: str, meant: str) -> None:
    with pytest.raises(UnknownMethodError, match=f"did you mean '{meant}'"):
        st.soft_topk([1.0, 2.0], 1, typed)


def test_unrelated_names_list_the_valid_ones() -> None:
    with pytest.raises(UnknownMethodError) as info:
        st.get_method("softmax-of-doom")
    assert "did you mean" not in str(info.value) and "thre-laplace" in str(info.value)
    assert "lapsum (thre-laplace)" in str(info.value)


# ---- parameters ------------------------------------------------------------------------------


def test_param_spec_validates_type_and_range() -> None:
    samples = ParamSpec("samples", int, 1000, "Monte-Carlo samples", minimum=1, maximum=1e7)
    assert samples.option == "--samples"
    assert samples.validate(10.0, "m") == 10 and isinstance(samples.validate(np.int64(5), "m"), int)
    for bad in (0, 2.5, True, "10", float("nan"), 1e8, None):
        with pytest.raises(InvalidArgumentError, match=r"samples of method 'm' must be an integer in \[1, 10000000\]"):
            samples.validate(bad, "m")
    tol = ParamSpec("tol", float, 1e-9, "tolerance", minimum=0.0)
    assert tol.option == "--tol" and tol.validate(1, "m") == 1.0
    with pytest.raises(InvalidArgumentError, match="finite number"):
        tol.validate(float("inf"), "m")
    assert ParamSpec("max_iter", int, 100, "cap").option == "--max-iter"


def test_methods_without_parameters_refuse_them() -> None:
    with pytest.raises(InvalidArgumentError, match=r"method 'grad' has no parameter 'samples' \(its parameters: none\)"):
        st.soft_topk([1.0, 2.0], 1, "grad", samples=10)


# ---- a toy method, registered in a test only ---------------------------------------------------


def _toy_forward(z: np.ndarray, k: int, *, power: int = 1, seed: int = 0) -> Forward:
    """``p = clip(z - lambda, 0, 1) ** power``-like threshold map, solved by the bisection reference."""
    p, _ = threshold_bisection(lambda t: np.clip(t, 0.0, 1.0) ** power)(z, k, ReferenceContext(z, k))
    t = np.clip(np.cbrt(p) if power == 3 else p, 0.0, 1.0)
    d = np.where((t > 0) & (t < 1), power * t ** (power - 1), 0.0)
    rng = np.random.default_rng(seed)
    return Forward(p=p, q=1.0 - p, aux={"d": d, "stderr": np.full_like(p, 1e-12) + 0.0 * rng.random(p.shape)})


def _toy_spec() -> MethodSpec:
    return MethodSpec(
        name="toy-clip",
        summary="A toy threshold map registered by a test.",
        family="threshold",
        guarantees=dataclasses.replace(METHODS["thre-exp"].guarantees, softmax_at_k1=False, sparse=True),
        reference="none",
        implementation=Implementation(
            forward=_toy_forward, jacobian=threshold_jacobian, vjp=threshold_vjp, elementwise=True
        ),
        capabilities=Capabilities(evaluation=Evaluation.MONTE_CARLO),
        parameters=(
            ParamSpec("power", int, 1, "exponent of the clipped map", minimum=1, maximum=3),
            ParamSpec("seed", int, 0, "seed", minimum=0),
        ),
        probe=ProbeReference("bisection", threshold_bisection(lambda t: np.clip(t, 0.0, 1.0))),
        failures=(FailureCode("toy", "never happens"),),
        aliases=(registry.Alias("toy", "a test"),),
    )


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> MethodSpec:
    # modules that snapshot the registry when first imported (the probe's default methods) must
    # load before the patch, or they would keep the toy method after the test
    import topk_cli.analysis.probe  # noqa: F401

    spec = _toy_spec()
    monkeypatch.setattr(registry, "METHODS", MappingProxyType({**METHODS, spec.name: spec}))
    monkeypatch.setattr(registry, "ALIASES", MappingProxyType({**ALIASES, "toy": spec.name}))
    return spec


def test_a_toy_method_runs_through_the_api_with_its_parameters(toy: MethodSpec) -> None:
    x = np.array([[0.9, 0.1, 0.5, -2.0], [3.0, 2.9, 0.0, 0.0]])
    p1 = st.soft_topk(x, 2, "toy")
    p3 = st.soft_topk(x, 2, "toy-clip", power=3)
    np.testing.assert_allclose(p1.sum(axis=1), 2.0, atol=1e-12)
    assert not np.allclose(p1, p3)
    r = st.evaluate(x, 2, "toy", power=3, seed=4)
    assert r.params == {"power": 3, "seed": 4} and r.stderr is not None and r.stderr.shape == x.shape
    assert st.evaluate(x, 2, "toy").params == {"power": 1, "seed": 0}
    with pytest.raises(InvalidArgumentError, match=r"power of method 'toy-clip' must be an integer in \[1, 3\]"):
        st.soft_topk(x, 2, "toy", power=4)
    jac = st.jacobian(x, 2, "toy", power=3)
    np.testing.assert_allclose(st.vjp(x, 2, np.ones_like(x), "toy", power=3), np.einsum("bi,bij->bj", np.ones_like(x), jac),
                               atol=1e-12)


def test_a_toy_method_runs_through_the_probe(toy: MethodSpec) -> None:
    from topk_cli.analysis.probe import stability_probe

    report = stability_probe(methods=["toy"], ns=[6], ks=[2], scales=[1.0], trials=3)
    cell = report.cells[0]
    assert cell.method == "toy-clip" and cell.failures == 0 and cell.max_error < 1e-12


def test_bind_passes_each_function_only_its_parameters() -> None:
    calls = {}

    def forward(z: np.ndarray, k: int, *, samples: int) -> Forward:
        calls["forward"] = samples
        return Forward(p=np.zeros_like(z), q=np.ones_like(z))

    def jacobian(fwd: Forward, z: np.ndarray, k: int) -> np.ndarray:
        return np.zeros(z.shape + z.shape[-1:])

    def vjp(fwd: Forward, z: np.ndarray, k: int, v: np.ndarray, **params: object) -> np.ndarray:
        calls["vjp"] = params
        return np.zeros_like(z)

    spec = dataclasses.replace(
        _toy_spec(), implementation=Implementation(forward=forward, jacobian=jacobian, vjp=vjp),
        parameters=(ParamSpec("samples", int, 7, "n"), ParamSpec("seed", int, 0, "s")),
    )
    impl = spec.bind({"seed": 3})
    impl.forward(np.zeros((1, 2)), 1)
    impl.jacobian(Forward(p=np.zeros((1, 2)), q=np.ones((1, 2))), np.zeros((1, 2)), 1)
    impl.vjp(Forward(p=np.zeros((1, 2)), q=np.ones((1, 2))), np.zeros((1, 2)), 1, np.zeros((1, 2)))
    assert calls == {"forward": 7, "vjp": {"samples": 7, "seed": 3}}
    assert METHODS["grad"].bind() is METHODS["grad"].implementation  # no parameters: unchanged


# ---- failure codes ---------------------------------------------------------------------------


def test_failure_codes_reported_are_declared() -> None:
    wide = np.array([[0.0, 50.0, 100.0], [3.0, 2.0, 1.0]])
    pole = np.array([[0.0, -9.63, -0.03]])
    for spec in METHODS.values():
        for x, k, tau in ((wide, 2, 0.01), (pole, 3, 1.0), (np.linspace(0, 5, 12)[None] * 40, 8, 1.0)):
            result = st.evaluate(x, k, spec.name, tau=tau)
            for failure in result.failures:
                assert spec.failure_meaning(failure.code), f"{spec.name}: undeclared code {failure.code!r}"
    assert METHODS["grad-recursive"].failure_meaning("log0")
    assert METHODS["grad"].failure_meaning("log0") is None


# ---- Monte-Carlo methods are judged within their standard errors ----------------------------


def _noisy_forward(z: np.ndarray, k: int, *, noise: float = 0.0, seed: int = 0) -> Forward:
    """thre-sigmoid plus a fixed perturbation of size ``noise`` that keeps the sum, stderr 1e-3."""
    fwd = METHODS["thre-sigmoid"].implementation.forward(z, k)
    bump = np.zeros_like(fwd.p)
    order = np.argsort(-z, axis=-1)
    rows = np.arange(z.shape[0])
    bump[rows, order[:, -1]] += noise  # the smallest score gains, the largest loses
    bump[rows, order[:, 0]] -= noise
    p = fwd.p + bump
    return Forward(p=p, q=fwd.q - bump, aux={**fwd.aux, "stderr": np.full_like(p, 1e-3)})


def _noisy_spec() -> MethodSpec:
    return dataclasses.replace(
        METHODS["thre-sigmoid"], name="noisy", aliases=(),
        implementation=dataclasses.replace(METHODS["thre-sigmoid"].implementation, forward=_noisy_forward),
        capabilities=Capabilities(evaluation=Evaluation.MONTE_CARLO),
        parameters=(ParamSpec("noise", float, 0.0, "perturbation"), ParamSpec("seed", int, 0, "seed", minimum=0)),
    )


def test_verify_properties_judges_monte_carlo_within_standard_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    from topk_cli.properties import Case, check_monotone_weak

    spec = _noisy_spec()
    monkeypatch.setattr(registry, "METHODS", MappingProxyType({**METHODS, spec.name: spec}))
    cases = [Case((0.0, 0.0005, 2.0, 3.0), 2)]  # 0 < 0.0005: p differ by ~1e-4 only
    # an order flip of 2e-3 (2 standard errors) is within the estimate's noise: not a violation
    within = dataclasses.replace(spec, parameters=(ParamSpec("noise", float, 2e-3, "p"), spec.parameters[1]))
    monkeypatch.setattr(registry, "METHODS", MappingProxyType({**METHODS, "noisy": within}))
    result = check_monotone_weak("noisy", cases)
    assert result.holds is True and result.within_stderr == registry.MONTE_CARLO_STDERRS
    # 20 standard errors is not noise: a violation
    beyond = dataclasses.replace(spec, parameters=(ParamSpec("noise", float, 2e-2, "p"), spec.parameters[1]))
    monkeypatch.setattr(registry, "METHODS", MappingProxyType({**METHODS, "noisy": beyond}))
    assert check_monotone_weak("noisy", cases).holds is False
    # the same deviation on an exact method is a violation at 1e-12
    exact = dataclasses.replace(within, capabilities=Capabilities())
    monkeypatch.setattr(registry, "METHODS", MappingProxyType({**METHODS, "noisy": exact}))
    r = check_monotone_weak("noisy", cases)
    assert r.holds is False and r.within_stderr is None


# ---- the CLI derives from the registry -------------------------------------------------------


def _cli(*args: str) -> CliResult:
    return run_cli(*args)


def test_cli_accepts_aliases_and_suggests_names() -> None:
    import json

    doc = json.loads(_cli("compute", "-m", "lapsum", "-m", "simple", "-k", "1", "--values", "1,2", "--format", "json").out)
    assert [r["method"] for r in doc["results"]] == ["thre-laplace", "grad"]
    r = _cli("compute", "-m", "thre_sigmoid", "-k", "1", "--values", "1,2")
    assert r.code == 2 and "did you mean 'thre-sigmoid'?" in r.err and "Traceback" not in r.err
    listing = json.loads(_cli("methods", "--format", "json").out)
    assert listing["aliases"] == dict(ALIASES)
    by_name = {m["name"]: m for m in listing["methods"]}
    assert [a["name"] for a in by_name["thre-laplace"]["aliases"]] == ["lapsum"]
    assert by_name["grad-recursive"]["failure_codes"] and by_name["grad"]["evaluation"] == "exact"


def test_cli_compute_sum_adds_the_soft_sum_and_the_potential() -> None:
    import json

    doc = json.loads(_cli("compute", "-m", "grad", "-m", "iterative", "-k", "2", "--sum", "--values", "3,1,2,0;1,1,1,1",
                          "--format", "json").out)
    grad, iterative = doc["results"]
    x = np.array([[3, 1, 2, 0], [1, 1, 1, 1]], dtype=float)
    value, potential = st.soft_topk_sum(x, 2, "grad")
    assert grad["topk_sum"] == value.tolist() and grad["potential"] == potential.tolist()
    assert iterative["potential"] is None and len(iterative["topk_sum"]) == 2
    csv_text = _cli("compute", "-m", "grad", "-k", "2", "--sum", "--values", "3,1,2,0", "--format", "csv").out
    assert csv_text.splitlines()[0].endswith(",topk_sum,potential")
    table = _cli("compute", "-m", "grad", "-k", "2", "--sum", "--values", "3,1,2,0").out
    assert "sum p*x" in table and "potential" in table
    assert "topk_sum" not in _cli("compute", "-m", "grad", "-k", "2", "--values", "3,1,2", "--format", "json").out


def test_cli_parameters_go_to_the_methods_that_take_them(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    import topk_cli.comparison as comparison

    r = _cli("compute", "-m", "grad", "-k", "1", "--values", "1,2", "--samples", "10")
    assert r.code == 2 and "--samples applies to " in r.err and "no selected method takes it" in r.err
    spec = _toy_spec()
    monkeypatch.setattr(registry, "METHODS", MappingProxyType({**METHODS, spec.name: spec}))
    monkeypatch.setattr(comparison, "METHODS", registry.METHODS)
    monkeypatch.setattr("topk_cli.render.compute.METHODS", registry.METHODS)
    doc = json.loads(_cli("compute", "-m", "toy-clip", "-m", "grad", "-k", "2", "--seed", "3", "--values", "1,2,0.5",
                          "--format", "json").out)
    toy, grad = doc["results"]
    assert toy["parameters"] == {"power": 1, "seed": 3} and "parameters" not in grad
    assert len(toy["stderr"]) == 1 and "stderr" not in grad
    r = _cli("compute", "-m", "grad", "-k", "2", "--seed", "3", "--values", "1,2,0.5")
    assert r.code == 2 and "toy-clip" in r.err and "no selected method takes it" in r.err
