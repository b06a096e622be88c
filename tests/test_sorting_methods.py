"""neuralsort, softsort and sorting-network: against their mpmath definitions, the authors' code, exact
small cases; Jacobians against finite differences of the references (one-sided at ties); VJPs
against ``v^T J``; chunking; the per-row memory limit."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import reference as ref
import reference_sorting as rs

import topk_cli as st
from topk_cli.errors import InvalidArgumentError
from topk_cli.operators import sorting

METHODS = ["neuralsort", "softsort", "sorting-network"]


@functools.cache
def _ref(method: str, x: tuple[float, ...], k: int) -> np.ndarray:
    return np.array(ref.to_floats(rs.REFERENCES[method](list(x), k, 1.0)))


def _api_z(x: np.ndarray, tau: float) -> np.ndarray:
    """``(x - max) / tau`` in float64 as the API prepares it: the operator is judged on its input."""
    finite = np.isfinite(x)
    z = (x - x[finite].max()) / tau
    return np.where(finite, z, -np.inf)


def _vector(n: int, spread: float, offset: float, kind: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n) * spread
    if kind == "ties" and n >= 2:
        x = rng.choice(x[: max(1, n // 2)], size=n)
        x[:2] = x[0]
    elif kind == "near-ties" and n >= 2:
        order = np.argsort(-x)
        for a, b in zip(order[::2], order[1::2], strict=False):
            x[b] = x[a] - spread * 1e-10 * rng.uniform(0.5, 1.5)
    elif kind == "masked" and n >= 3:
        x[rng.choice(n, size=n // 3, replace=False)] = -np.inf
    return x + offset


def _tie_averaged(z: np.ndarray, p: np.ndarray) -> np.ndarray:
    """``p`` averaged over groups of exactly equal ``z``: the API's rule that equal inputs get equal
    weights (it changes only the network, whose tied entries otherwise get different weights)."""
    out = p.copy()
    for value in np.unique(z[np.isfinite(z)]):
        out[z == value] = p[z == value].mean()
    return out


def _grid() -> list[tuple[str, np.ndarray, float]]:
    out = [("n=1", np.array([0.3]), 1.0)]
    seed = 0
    for n in (2, 3, 5, 8):
        for kind in ("random", "ties", "near-ties", "masked"):
            for spread in (1e-6, 1.0, 1e3):
                for offset in (0.0, 1e6):
                    for tau in (1e-2, 1.0, 100.0):
                        seed += 1
                        name = f"n={n} {kind} spread={spread:g} offset={offset:g} tau={tau:g}"
                        out.append((name, _vector(n, spread, offset, kind, seed), tau))
    return out


GRID = _grid()

#: Absolute tolerance per method, relative to max(1, max |z|) for the network: its relaxed values
#: carry a rounding error of order eps max|z| from layer to layer (a backward error of the size of
#: one ulp of z, as the rounding of z itself), which the comparators pass on with slope <= 1/4.
TOL = 1e-12


def _tolerance(method: str, z: np.ndarray) -> float:
    if method == "sorting-network":
        return TOL * max(1.0, float(np.max(np.abs(z[np.isfinite(z)]))))
    return TOL


@pytest.mark.parametrize("method", METHODS)
def test_adversarial_grid_against_the_mpmath_definition(method: str) -> None:
    """Every k on 289 vectors: offsets, spreads 1e-6..1e3, ties, near-ties (1e-10 of the spread),
    masks, taus 1e-2..100; judged against the definition evaluated on the operator's input z."""
    worst: list[tuple[float, str]] = []
    checked = 0
    for name, x, tau in GRID:
        z = _api_z(x, tau)
        m = int(np.isfinite(x).sum())
        for k in range(1, m + 1):
            res = st.evaluate(x, k, method, tau=tau)
            assert res.ok, (name, res.failures)
            want = _tie_averaged(z, _ref(method, tuple(z.tolist()), k))
            err = float(np.max(np.abs(res.weights - want)))
            checked += 1
            if err > _tolerance(method, z):
                worst.append((err, f"{name} k={k}"))
    assert checked > 1000
    assert not worst, sorted(worst, reverse=True)[:5]


@pytest.mark.parametrize("method", METHODS)
def test_masked_entries_are_exact_zeros_and_the_rest_as_if_absent(method: str) -> None:
    x = np.array([0.4, -np.inf, 1.3, -0.2, 0.9, -np.inf])
    keep = [0, 2, 3, 4]
    for k in (1, 2, 4):
        res = st.evaluate(x, k, method, tau=0.6)
        assert res.weights[1] == 0.0 and res.weights[5] == 0.0
        assert res.complement[1] == 1.0 and res.complement[5] == 1.0
        np.testing.assert_array_equal(res.weights[keep], st.soft_topk(x[keep], k, method, tau=0.6))


#: The authors' code in float64 on x = (0.3, -1.2, 2.5, 0, 1.1, -0.4), tau = 0.7, k = 2: NeuralSort
#: (ermongroup/neuralsort, pytorch/neuralsort.py), SoftSort (sprillo/softsort, pytorch/softsort.py),
#: diffsort (Felix-Petersen/diffsort 5c417ea: odd_even_network(6), sort(..., steepness=1/0.7,
#: distribution='logistic'), the sum of the last 2 columns of its matrix), run with torch 2.13 CPU.
AUTHORS = {
    "neuralsort": [0.20993206998492867, 1.0979361921364757e-06, 0.9644572578202937, 0.05742377820127872,
                   0.7649054639748158, 0.0032803320824909958],
    "softsort": [0.21069831632802052, 0.024718950769066033, 0.8891242202552129, 0.1372571126121059,
                 0.6606898211690787, 0.07751157886651598],
    "sorting-network": [0.08808455229330933, 0.015844759868277093, 0.9038369078945401, 0.11394542543533764,
                        0.6799765485710294, 0.1983118059375063],
}


@pytest.mark.parametrize("method", METHODS)
def test_agrees_with_the_authors_implementation(method: str) -> None:
    x = np.array([0.3, -1.2, 2.5, 0.0, 1.1, -0.4])
    np.testing.assert_allclose(st.soft_topk(x, 2, method, tau=0.7), AUTHORS[method], rtol=0, atol=1e-14)


# -- exact small cases --------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_n1_all_equal_and_sum(method: str) -> None:
    assert st.soft_topk([2.5], 1, method).tolist() == [1.0]
    for k in (1, 2, 3, 5):
        np.testing.assert_allclose(st.soft_topk(np.full(5, 1.7), k, method, tau=0.3), k / 5, rtol=0, atol=1e-15)
    x = np.random.default_rng(3).normal(size=(4, 9)) * 3
    for k in (1, 4, 9):
        np.testing.assert_allclose(st.soft_topk(x, k, method, tau=0.5).sum(axis=-1), k, rtol=0, atol=1e-13)


def test_softsort_is_softmax_at_k1_and_neuralsort_and_the_network_are_not() -> None:
    x = np.array([0.3, -1.2, 2.5, 0.0, 1.1])
    soft = np.exp(x - x.max())
    soft /= soft.sum()
    np.testing.assert_allclose(st.soft_topk(x, 1, "softsort"), soft, rtol=0, atol=1e-15)
    for method in ("neuralsort", "sorting-network"):
        assert np.max(np.abs(st.soft_topk(x, 1, method) - soft)) > 1e-2


def test_neuralsort_and_softsort_exceed_one_the_network_stays_in_range() -> None:
    """Their rows sum to 1, their columns do not: k = n is not all ones."""
    x = np.array([0.0, -1.0, -2.0])
    np.testing.assert_allclose(st.soft_topk(x, 3, "neuralsort"), [0.94655363, 1.10689274, 0.94655363], atol=1e-8)
    np.testing.assert_allclose(st.soft_topk(x, 3, "softsort"), [0.96721309, 1.06557383, 0.96721309], atol=1e-8)
    assert st.soft_topk(x, 3, "sorting-network").tolist() == [1.0, 1.0, 1.0]
    rng = np.random.default_rng(4)
    p = st.soft_topk(rng.normal(size=(50, 7)) * 2, 3, "sorting-network")
    assert p.min() >= 0.0 and p.max() <= 1.0


def test_the_network_depends_on_the_order_of_the_entries() -> None:
    """Fixed wires: permuting x does not permute p (diffsort's behaviour, not a defect)."""
    a = st.soft_topk([2.0, 0.0, 1.0], 1, "sorting-network")
    b = st.soft_topk([0.0, 1.0, 2.0], 1, "sorting-network")
    assert abs(a[0] - b[2]) > 0.1


@pytest.mark.parametrize("method", METHODS)
def test_hard_limit(method: str) -> None:
    x = np.array([0.3, -1.2, 2.5, 0.0, 1.1, 1.1, -0.4])
    for k in (1, 2, 3, 4, 7):
        np.testing.assert_allclose(st.soft_topk(x, k, method, tau=1e-4), st.soft_topk(x, k, "hard"), rtol=0, atol=1e-12)


# -- derivatives --------------------------------------------------------------------------------


@functools.cache
def _fd(method: str, x: tuple[float, ...], k: int, tau: float, side: int = 0) -> np.ndarray:
    """``dp/dx`` of the mpmath reference: central differences (``side`` 0), or one-sided, as each
    ``x_j`` increases (``side`` 1) or decreases (``side`` -1)."""
    from mpmath import mp, mpf

    fn = rs.REFERENCES[method]
    if not side:
        jac = ref.jacobian_fd(fn, list(x), k, tau)
        return np.array([[float(v) for v in row] for row in jac])
    with mp.workdps(90):
        xs = [mpf(v) for v in x]
        h = side * mpf(10) ** -30
        base = fn(xs, k, tau, dps=90)
        out = np.zeros((len(x), len(x)))
        for j in range(len(x)):
            moved = list(xs)
            moved[j] += h
            pm = fn(moved, k, tau, dps=90)
            for i in range(len(x)):
                out[i, j] = float((pm[i] - base[i]) / h)
        return out


def _jac_cases() -> list[tuple[str, tuple[float, ...], int, float]]:
    rng = np.random.default_rng(2024)
    out = []
    for n, k, tau in [(2, 1, 1.0), (4, 2, 0.1), (5, 1, 0.5), (5, 3, 2.0), (6, 2, 10.0), (6, 5, 0.3), (7, 7, 0.8)]:
        out.append((f"n={n} k={k} tau={tau:g}", tuple(rng.normal(size=n).tolist()), k, tau))
    x = rng.normal(size=6)
    x[[1, 4]] = -np.inf
    out.append(("masked n=6 k=2", tuple(x.tolist()), 2, 0.7))
    return out


@pytest.mark.parametrize("case", _jac_cases(), ids=lambda c: c[0])
@pytest.mark.parametrize("method", METHODS)
def test_jacobian_against_finite_differences_of_the_reference(method: str, case: tuple) -> None:
    _, x, k, tau = case
    got = st.jacobian(np.array(x), k, method, tau=tau)
    want = _fd(method, x, k, tau)
    assert np.max(np.abs(got - want)) <= 1e-10 * max(1.0, np.abs(want).max())


TIED = [((1.0, 0.5, 1.0, -0.3), 1), ((1.0, 0.5, 1.0, -0.3), 2), ((0.0, -0.7, -2.0, -0.7), 2),
         ((0.4, 0.4), 1), ((1.0, 0.5, 1.0, 0.5, 0.0), 4), ((0.2, -1.0, 0.2, 1.0), 3)]


@pytest.mark.parametrize("method", ["neuralsort", "softsort"])
def test_jacobian_at_a_tie_is_one_sided_per_column(method: str) -> None:
    """|.| has kinks at ties; ties are broken by rank: of a tied pair, the earlier entry's column is
    the derivative as it increases, the later one's as it decreases (the smooth branch where the
    earlier entry ranks first)."""
    checked = 0
    for x, k in TIED:
        got = st.jacobian(np.array(x), k, method, tau=0.6)
        right, left = _fd(method, x, k, 0.6, 1), _fd(method, x, k, 0.6, -1)
        for j, value in enumerate(x):
            later = any(x[i] == value for i in range(j))  # an earlier entry ties with it
            want = left[:, j] if later else right[:, j]
            assert np.max(np.abs(got[:, j] - want)) <= 1e-10 * max(1.0, np.abs(want).max()), (x, k, j)
            checked += 1
    assert checked == 23


@pytest.mark.parametrize("method", METHODS)
def test_derivatives_along_directions_that_keep_ties_are_exact(method: str) -> None:
    """d/dtau keeps tied entries tied: exact for every method at ties (the network's tied weights
    are averaged, and so are its derivatives), against central differences of the reference."""
    from mpmath import mp, mpf

    for x, k in TIED:
        z = np.array(x) - max(x)
        got = st.jacobian(np.array(x), k, method, tau=0.6, wrt="tau")
        with mp.workdps(90):
            h = mpf(10) ** -30
            up = rs.REFERENCES[method](list(x), k, mpf("0.6") + h, dps=90)
            down = rs.REFERENCES[method](list(x), k, mpf("0.6") - h, dps=90)
            want = np.array([float((u - d) / (2 * h)) for u, d in zip(up, down, strict=True)])
        want = _tie_averaged(z, want)
        assert np.max(np.abs(got - want)) <= 1e-10 * max(1.0, np.abs(want).max()), (x, k)


@pytest.mark.parametrize("method", METHODS)
def test_vjp_is_v_times_the_jacobian(method: str) -> None:
    rng = np.random.default_rng(8)
    x = rng.normal(size=(5, 7))
    x[1, 2] = -np.inf
    x[2, [0, 4]] = -np.inf
    x[3, 5] = x[3, 1]  # a tie
    x[4] = np.round(x[4])  # several
    v = rng.normal(size=x.shape)
    for k in (1, 3, np.array([1, 2, 3, 4, 5])):
        jac = st.jacobian(x, k, method, tau=0.8)
        got = st.vjp(x, k, v, method, tau=0.8)
        np.testing.assert_allclose(got, np.einsum("bi,bij->bj", v, jac), rtol=0, atol=1e-13 * max(1.0, np.abs(jac).max()))


@pytest.mark.parametrize("method", METHODS)
def test_chunked_rows_give_the_same_bits(method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(9)
    x = rng.normal(size=(12, 9))
    x[::3, 4] = -np.inf
    v = rng.normal(size=x.shape)
    whole = st.soft_topk(x, 3, method), st.vjp(x, 3, v, method), st.jacobian(x, 3, method)
    monkeypatch.setattr(sorting, "CHUNK_ENTRIES", 50)  # one row per chunk, cotangents in blocks
    parts = st.soft_topk(x, 3, method), st.vjp(x, 3, v, method), st.jacobian(x, 3, method)
    for a, b in zip(whole, parts, strict=True):
        np.testing.assert_array_equal(a, b)


def test_an_all_tied_row_gets_the_networks_gradient() -> None:
    """Averaging the tied weights must not zero the gradient of a row whose scores start equal (its
    derivative along tie-breaking directions is the network's own); along tie-keeping ones it is
    that of the averaged weights (d/dtau above)."""
    from topk_cli.operators._base import Forward

    z = np.zeros((1, 4))
    own = sorting._network_jac(z, 2)[0]
    jac = st.jacobian(np.full(4, 2.0), 2, "sorting-network", tau=0.5)
    np.testing.assert_allclose(jac, own / 0.5, rtol=0, atol=1e-15)
    assert np.abs(own).max() > 0.1
    np.testing.assert_allclose(jac.sum(axis=1), 0.0, atol=1e-15)  # a shift changes nothing
    fwd = Forward(p=np.full((1, 4), 0.5), q=np.full((1, 4), 0.5))
    v = np.array([[1.0, -2.0, 0.5, 3.0]])
    np.testing.assert_allclose(sorting.SORTING_NETWORK.vjp(fwd, z, 2, v), v @ own, rtol=0, atol=1e-15)


# -- the memory limit ---------------------------------------------------------------------------


def test_rows_above_the_memory_limit_are_refused_before_any_work() -> None:
    big = np.zeros(2**20)
    big[0] = 1.0
    for method in ("neuralsort", "softsort"):
        with pytest.raises(InvalidArgumentError, match=r"k\*n = 6\.711e\+07 .*limit of 33554432 \(2\^25"):
            st.soft_topk(big, 64, method)
    with pytest.raises(InvalidArgumentError, match=r"n\(n-1\)/2 = 3\.356e\+07 .*n = 8193.*use n <= 8192"):
        st.soft_topk(np.zeros(8193), 1, "sorting-network")
    sorting._check_size("sorting-network", 8192, 1)  # the largest n accepted
    sorting._check_size("neuralsort", 2**20, 32)


def test_the_cli_refuses_with_one_line() -> None:
    from conftest import run_cli

    code, _, err = run_cli("compute", "-m", "sorting-network", "-k", "1", "--values", ",".join(["0"] * 8193))
    assert code != 0 and "limit of 33554432" in err and "Traceback" not in err


def test_the_smoothness_check_sees_the_networks_jump_at_a_tie() -> None:
    """p(0) off both one-sided limits (the tied weights averaged) is a jump: it was measured C0,
    from the one-sided differences through p(0) only."""
    from topk_cli.properties import Case, check_smooth

    assert st.soft_topk([1.0, 0.0, 0.0], 2, "sorting-network").tolist() != st.soft_topk([1.0, 0.0, 1e-12], 2, "sorting-network").tolist()
    assert check_smooth("sorting-network", [Case((1.0, 0.0, 0.0), 2)]).smoothness == "discontinuous"
    assert check_smooth("neuralsort", [Case((1.0, 0.0, 0.0), 2)]).smoothness == "C0"
