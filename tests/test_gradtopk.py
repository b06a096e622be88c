"""GradTopK: ``grad`` (log-space dynamic program) and ``grad-recursive`` (the article's recursion).

Oracles: exact enumeration of the k-subsets in mpmath (``P(S) ∝ exp(sum_{i in S} x_i / tau)``),
giving the marginals ``p``, the complements ``q = P(i not in S)`` (summed directly, so relatively
accurate even where ``p`` rounds to 1) and the covariance matrix (the Jacobian); central finite
differences; and ``tests/reference.py`` (independent mpmath ESP tables) for larger n.
"""

from __future__ import annotations

import itertools

import mpmath
import numpy as np
import pytest
import reference as ref
from mpmath import mp, mpf

import topk_cli as st
from topk_cli.errors import NumericalFailureError
from topk_cli.operators.grad_recursive import CANCELLATION_TOLERANCE

DPS = 60


def enumerate_subsets(x: np.ndarray, k: int, tau: float = 1.0) -> tuple[list, list, list]:
    """``(p, q, cov)`` of the k-subset distribution of ``x / tau`` by enumeration (mpmath)."""
    with mp.workdps(DPS):
        xs = [mpf(float(v)) for v in x]
        idx = [i for i, v in enumerate(xs) if v != mpmath.ninf]
        n = len(xs)
        top = max(xs[i] for i in idx)
        subsets = list(itertools.combinations(idx, k))
        logw = [mpmath.fsum((xs[i] - top) / mpf(tau) for i in s) for s in subsets]
        m = max(logw)
        w = [mpmath.exp(v - m) for v in logw]
        total = mpmath.fsum(w)
        both = [[mpf(0)] * n for _ in range(n)]
        out = [mpf(0)] * n
        for s, ws in zip(subsets, w, strict=True):
            for i in s:
                for j in s:
                    both[i][j] += ws
            for i in set(idx) - set(s):
                out[i] += ws
        p = [both[i][i] / total for i in range(n)]
        q = [out[i] / total if i in idx else mpf(1) for i in range(n)]
        cov = [
            [both[i][j] / total - p[i] * p[j] if i in idx and j in idx else mpf(0) for j in range(n)]
            for i in range(n)
        ]
        return p, q, cov


def grid() -> list[tuple[str, np.ndarray, int]]:
    """Adversarial small vectors (n <= 10), shifted so that the max is exactly 0 (the library's
    shift is then exact and the oracle sees the same numbers), with every k."""
    rng = np.random.default_rng(20240917)
    cases = []
    for n in (1, 2, 3, 5, 8, 10):
        for spread in (1e-12, 1e-3, 1.0, 30.0, 1e4, 1e300):
            x = rng.normal(size=n) * spread
            if n >= 4 and spread == 30.0:  # a near-tie and an exact tie
                x[1] = x[0] + 1e-9
                x[3] = x[2]
            x = x - x.max()
            for k in sorted(k for k in {1, 2, n // 2, n - 1, n} if 1 <= k <= n):
                cases.append((f"n={n} spread={spread:g} k={k}", x, k))
    x = np.array([0.0, -np.inf, -0.5, -1.0, -np.inf, -3.0])  # masked entries
    cases += [(f"masked k={k}", x, k) for k in (1, 2, 3, 4)]
    return cases


GRID = grid()


@pytest.mark.parametrize(("name", "x", "k"), GRID, ids=[c[0] for c in GRID])
def test_grad_matches_enumeration(name: str, x: np.ndarray, k: int) -> None:
    p_ref, q_ref, _ = enumerate_subsets(x, k)
    r = st.evaluate(x, k, "grad")
    assert r.ok
    assert np.max(np.abs(r.weights - np.array([float(v) for v in p_ref]))) <= 1e-13
    # q = 1 - p relatively accurate, also where p rounds to 1 (log q compared)
    for qi, qr in zip(r.complement, q_ref, strict=True):
        if qr > mpf(10) ** -300:
            assert abs(float(mpmath.log(qi) - mpmath.log(qr))) <= 1e-14 * max(1.0, abs(float(mpmath.log(qr))))
        else:
            assert qi <= 1e-290
    assert np.all(np.abs(r.weights + r.complement - 1.0) <= 4e-16)


def test_known_value() -> None:
    probs = np.array([0.3, 0.6, 0.5, 0.2])
    p = st.soft_topk(np.log(probs / (1 - probs)), 2, "grad")
    np.testing.assert_array_equal(p.round(4), [0.3568, 0.7622, 0.6595, 0.2216])


def test_saturated_complement_keeps_its_digits() -> None:
    x = np.array([0.0, -5.0, -60.0, -100.0])  # p_0, p_1 within 1e-24 of 1
    r = st.evaluate(x, 2, "grad")
    _, q_ref, _ = enumerate_subsets(x, 2)
    assert r.weights[0] == 1.0 and r.complement[0] > 0
    np.testing.assert_allclose(r.complement, [float(v) for v in q_ref], rtol=1e-13)


def test_offset_and_tau_do_not_change_the_answer() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=7)
    base = st.soft_topk(x, 3, "grad")
    np.testing.assert_allclose(st.soft_topk(x + 1e6, 3, "grad"), base, atol=1e-9)  # x + 1e6 rounds
    xo = 1e6 + np.round(x, 3)
    p_ref, _, _ = enumerate_subsets(xo, 3)
    assert np.max(np.abs(st.soft_topk(xo, 3, "grad") - np.array([float(v) for v in p_ref]))) <= 1e-13
    np.testing.assert_allclose(st.soft_topk(2 * x, 3, "grad", tau=2.0), base, atol=1e-15)


def test_k1_is_softmax() -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(4, 9)) * np.array([[0.01], [1.0], [10.0], [300.0]])
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(
        st.soft_topk(x, 1, "grad"), e / e.sum(axis=-1, keepdims=True), rtol=1e-13, atol=1e-300
    )


def test_edge_cases() -> None:
    np.testing.assert_array_equal(st.soft_topk([4.0], 1, "grad"), [1.0])
    np.testing.assert_array_equal(st.soft_topk([3.0, 1.0, 2.0], 3, "grad"), [1.0, 1.0, 1.0])
    np.testing.assert_allclose(st.soft_topk(np.full(6, 2.5), 2, "grad"), np.full(6, 1 / 3), rtol=1e-15)
    # tau tiny: z ~ -1e290, the hard top-k, with exact 0/1 complements
    r = st.evaluate([1.0, 3.0, 2.0, 0.0], 2, "grad", tau=1e-300)
    np.testing.assert_array_equal(r.weights, [0.0, 1.0, 1.0, 0.0])
    np.testing.assert_array_equal(r.complement, [1.0, 0.0, 0.0, 1.0])
    # masked entries are absent: zero weight, the rest as without them (k > m/2 uses the complement)
    x = np.array([0.3, -np.inf, 1.2, 0.7, -np.inf])
    for k in (1, 2, 3):
        p = st.soft_topk(x, k, "grad")
        assert p[1] == 0.0 and p[4] == 0.0
        np.testing.assert_allclose(p[[0, 2, 3]], st.soft_topk(x[[0, 2, 3]], k, "grad"), atol=1e-16)
    # equal inputs give equal outputs; float32 in, float32 out
    p = st.soft_topk(np.array([1.0, 2.0, 2.0, 0.5, 2.0], dtype=np.float32), 2, "grad")
    assert p.dtype == np.float32 and p[1] == p[2] == p[4]


def test_complement_identity_and_batch_with_mixed_masks() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(6, 40)) * 3
    x[1, :15] = -np.inf
    x[2, ::2] = -np.inf
    k = 12
    p = st.soft_topk(x, k, "grad")  # rows 1 and 2 have k > m / 2: the complement program
    for b in range(6):
        row = x[b]
        keep = np.isfinite(row)
        single = st.soft_topk(row[keep], k, "grad")
        np.testing.assert_allclose(p[b, keep], single, atol=1e-15)
        # p(z, k) = 1 - p(-z, m - k)
        m = int(keep.sum())
        if k < m:
            other = st.evaluate(-row[keep], m - k, "grad")
            np.testing.assert_allclose(p[b, keep], other.complement, atol=1e-14)
    np.testing.assert_allclose(p.sum(axis=-1), k, rtol=1e-14)


def test_larger_n_against_reference() -> None:
    rng = np.random.default_rng(4)
    x = rng.normal(size=60) * 2
    for k in (7, 30, 53):
        expected = np.array(ref.to_floats(ref.grad_esp(list(x), k, dps=30)))
        assert np.max(np.abs(st.soft_topk(x, k, "grad") - expected)) <= 1e-13


JAC_CASES = [
    (np.array([0.0, -0.3, -1.1, -2.0, -2.0]), 2),
    (np.array([0.0, -1.0, -40.0, -41.0, -80.0]), 2),  # saturated entries: tiny covariances
    (np.array([0.0, -np.inf, -0.5, -3.0, -0.7]), 3),
    (np.array([0.0, -0.2, -0.4, -5.0, -9.0, -0.1]), 4),
]


@pytest.mark.parametrize(("x", "k"), JAC_CASES)
def test_jacobian_is_the_subset_covariance(x: np.ndarray, k: int) -> None:
    _, _, cov = enumerate_subsets(x, k)
    jac = st.jacobian(x, k, "grad")
    c = np.array([[float(v) for v in row] for row in cov])
    scale = np.sqrt(np.outer(np.diag(c), np.diag(c)))
    # entrywise relative to sqrt(C_ii C_jj): tiny covariances of saturated entries are right too
    assert np.all(np.abs(jac - c) <= 1e-13 * scale + 1e-300)
    np.testing.assert_array_equal(jac, jac.T)
    assert np.all(np.abs(jac.sum(axis=-1)) <= 1e-15)
    assert np.linalg.eigvalsh(jac).min() >= -1e-15


def test_jacobian_matches_finite_differences_and_tau() -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(size=7)
    tau, h = 0.7, 1e-6
    jac = st.jacobian(x, 3, "grad", tau=tau)
    fd = np.empty((7, 7))
    for j in range(7):
        e = np.zeros(7)
        e[j] = h
        fd[:, j] = (st.soft_topk(x + e, 3, "grad", tau=tau) - st.soft_topk(x - e, 3, "grad", tau=tau)) / (
            2 * h
        )
    np.testing.assert_allclose(jac, fd, atol=1e-9)


def test_vjp_is_v_times_jacobian() -> None:
    rng = np.random.default_rng(6)
    x = rng.normal(size=(3, 2, 9)) * np.array([1.0, 10.0, 100.0])[:, None, None]
    x[1, 0, 4] = -np.inf
    v = rng.normal(size=x.shape)
    for k in (1, 4, 7):
        jac = st.jacobian(x, k, "grad")
        got = st.vjp(x, k, v, "grad")
        np.testing.assert_allclose(got, np.einsum("...i,...ij->...j", v, jac), atol=1e-14)
        assert got[1, 0, 4] == 0.0


def test_vjp_large_n_matches_finite_differences() -> None:
    rng = np.random.default_rng(7)
    x = rng.normal(size=300)
    v = rng.normal(size=300)
    h = 1e-6
    fd = (st.soft_topk(x + h * v, 120, "grad") - st.soft_topk(x - h * v, 120, "grad")) / (2 * h)
    np.testing.assert_allclose(st.vjp(x, 120, v, "grad"), fd, atol=1e-8)


# ---------------------------------------------------------------------------------------------
# grad-recursive


def test_recursive_log0_at_the_right_level() -> None:
    x = [0.0, 0.0, -50.0, -100.0]  # level-2 marginals of entries 0, 1 round to 1
    r = st.evaluate(x, 3, "grad-recursive")
    assert r.status == "log0" and np.isnan(r.weights).all()
    (f,) = r.failures
    assert (f.level, f.value) == (3, 0.0)
    assert "entry 0" in f.detail and "'grad'" in f.detail
    t = st.trace_grad_recursive(x, 3)
    assert t.kind.tolist() == ["log0"] and t.failed_level.tolist() == [3]
    np.testing.assert_allclose(t.value_before, [0.5])  # entry 0's level-2 argument, 1 - 1/2
    np.testing.assert_allclose(t.min_argument, [0.5])
    with pytest.raises(NumericalFailureError, match="log0"):
        st.soft_topk(x, 3, "grad-recursive")
    assert isinstance(NumericalFailureError(r.failures), ArithmeticError)


def test_recursive_log_negative() -> None:
    x = [10.8, 39.1, 28.4, -21.1]  # the level-2 marginal of entry 1 is computed as 1 + 4e-13
    r = st.evaluate(x, 3, "grad-recursive")
    assert r.status == "log-negative"
    (f,) = r.failures
    assert f.level == 3 and f.value is not None and f.value < 0 and "entry 1" in f.detail
    np.testing.assert_allclose(st.soft_topk(x, 3, "grad"), ref.to_floats(ref.grad(x, 3)), atol=1e-15)


def test_recursive_agrees_with_grad_on_easy_rows() -> None:
    rng = np.random.default_rng(8)
    x = rng.normal(size=(5, 12))
    for k in (1, 2, 3):
        r = st.evaluate(x, k, "grad-recursive")
        assert r.ok
        np.testing.assert_allclose(r.weights, st.soft_topk(x, k, "grad"), atol=1e-13)
        np.testing.assert_allclose(r.complement, st.evaluate(x, k, "grad").complement, rtol=1e-12)
    np.testing.assert_allclose(st.jacobian(x, 3, "grad-recursive"), st.jacobian(x, 3, "grad"))
    np.testing.assert_allclose(st.vjp(x, 3, x, "grad-recursive"), st.vjp(x, 3, x, "grad"))


def test_recursive_reports_instead_of_returning_wrong_values() -> None:
    rng = np.random.default_rng(9)
    kinds: set[str] = set()
    for n, k in ((8, 3), (20, 6), (40, 20), (60, 58), (100, 10)):
        scales = np.logspace(-1, 3, 40)[:, None]
        x = rng.normal(size=(40, n)) * scales
        x[::7, 0] = x[::7, 1]  # some exact ties
        r = st.evaluate(x, k, "grad-recursive")
        good = st.soft_topk(x, k, "grad")
        ok = r.status == "ok"
        kinds |= set(r.status[~ok].tolist())
        assert np.all(np.isnan(r.weights[~ok]))
        assert np.max(np.abs(r.weights[ok] - good[ok]), initial=0.0) <= 1e-12
        assert len(r.failures) == int((~ok).sum())
        if n == 8:  # and against the independent oracle, not only against grad
            for b in np.flatnonzero(ok)[::4]:
                expected = ref.to_floats(ref.grad(list(x[b]), k))
                assert np.max(np.abs(r.weights[b] - expected)) <= 1e-12
        trace = st.trace_grad_recursive(x, k)
        hard_fail = np.isin(r.status, ["log0", "log-negative"])
        np.testing.assert_array_equal(trace.kind[hard_fail], r.status[hard_fail])
        assert np.all(trace.kind[~hard_fail] == "ok")
    assert {"log0", "cancellation"} <= kinds  # the batch does exercise the failure paths


def test_recursive_cancellation_message() -> None:
    x = np.random.default_rng(10).normal(size=40)
    r = st.evaluate(x, 20, "grad-recursive")  # errors compound over 20 levels (~1e-7 here)
    assert r.status == "cancellation"
    (f,) = r.failures
    assert f"{CANCELLATION_TOLERANCE:g}" in f.detail and "'grad'" in f.detail
    assert f.value is not None and 0 < f.value < 1 and f.level is not None and 2 <= f.level <= 20


def test_recursive_near_uniform_many_levels_is_fine() -> None:
    x = np.random.default_rng(11).normal(size=200) * 1e-3
    r = st.evaluate(x, 100, "grad-recursive")  # arguments ~1/2 at every level, errors do not grow
    assert r.ok
    np.testing.assert_allclose(r.weights, st.soft_topk(x, 100, "grad"), atol=1e-12)


# ---------------------------------------------------------------------------------------------
# the probability-space program: agreement, fallback and memory


def test_probability_program_agrees_with_log_space_and_falls_back_on_wide_spreads() -> None:
    from topk_cli.operators import _poisson
    from topk_cli.operators.gradtopk import _logspace_rows, _start_tilt

    rng = np.random.default_rng(11)
    z = rng.normal(size=(6, 300)) * np.array([0.01, 1.0, 3.0, 10.0, 300.0, 1e4])[:, None]
    z = z - z.max(axis=1, keepdims=True)
    v = rng.normal(size=z.shape)
    res = _poisson.marginals(z, 40, _start_tilt(z, 40), v)
    lp, lq, ldp = _logspace_rows(z, 40, v)
    assert res.certified[:4].all() and not res.certified[5]  # spread 1e4: left to log space
    ok = res.certified
    assert np.max(np.abs(res.p[ok] - lp[ok])) <= 1e-14
    assert np.max(np.abs(np.log(res.q[ok]) - np.log(lq[ok]))) <= 1e-12
    assert ldp is not None and res.dp is not None
    assert np.max(np.abs(res.dp[ok] - ldp[ok])) <= 1e-14
    r = st.evaluate(z, 40, "grad")  # the public path recomputes the uncertified rows exactly
    np.testing.assert_allclose(r.weights, lp, atol=1e-14)


def test_grad_memory_does_not_grow_with_n_times_k() -> None:
    import tracemalloc

    x = np.random.default_rng(12).normal(size=5000)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        p = st.soft_topk(x, 1000, "grad")
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert abs(p.sum() - 1000) <= 1e-9
    assert peak < 64 * 2**20  # the full O(n k) tables alone would be 40 MB each, several of them


def test_probability_program_gives_a_row_the_same_bits_in_any_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row's p, q and tangent do not depend on the rows it is computed with: alone, or in
    chunks of two rows with a chunk of one left over (the table products must not switch to
    another summation order for a single column)."""
    from topk_cli.operators import _poisson
    from topk_cli.operators.gradtopk import _start_tilt

    rng = np.random.default_rng(31)
    budget0 = _poisson.BUDGET
    for k in (5, 15):
        z = rng.normal(size=(3, 40)) * 2.0
        z[1, 7] = -np.inf
        z -= np.max(z, axis=1, keepdims=True)
        v = rng.normal(size=z.shape)
        lam = _start_tilt(z, k)
        alone = [_poisson.marginals(z[i : i + 1], k, lam[i : i + 1], v[i : i + 1]) for i in range(3)]
        # one chunk of full tables; chunks of 2 + 1 rows, checkpointed every 7 entries
        for budget, layout in ((budget0, (3, 40)), (60 * (k + 1), (2, 7))):
            monkeypatch.setattr(_poisson, "BUDGET", budget)
            assert _poisson._layout(3, 40, k, 2) == layout
            batch = _poisson.marginals(z, k, lam, v)
            for i, one in enumerate(alone):
                assert one.dp is not None and batch.dp is not None
                np.testing.assert_array_equal(batch.p[i], one.p[0])
                np.testing.assert_array_equal(batch.q[i], one.q[0])
                np.testing.assert_array_equal(batch.dp[i], one.dp[0])


@pytest.mark.parametrize("method", ["grad", "grad-recursive"])
def test_fused_vjp_matches_the_separate_passes_and_raises_the_same(method: str) -> None:
    """``vjp`` runs the forward pass and the tangent together: same product as forward + VJP,
    and a row the forward pass rejects raises the same failure."""
    rng = np.random.default_rng(21)
    x = np.concatenate([rng.normal(size=(4, 9)), [[-np.inf, 0.5, -np.inf, 1.0, 2.0, 0.0, 3.0, -1.0, 0.2]]])
    v = rng.normal(size=x.shape)
    impl = st.METHODS[method].implementation
    for k in (1, 3, 7) if method == "grad" else (1, 2, 3):  # the recursion fails at k = 7 here
        z = (x - x.max(axis=-1, keepdims=True)) / 0.8
        want = impl.vjp(impl.forward(z, k), z, k, v) / 0.8
        np.testing.assert_array_equal(st.vjp(x, k, v, method, tau=0.8), want)
    bad = [0.0, 50.0, 100.0]
    with pytest.raises(NumericalFailureError) as fused:
        st.vjp(bad, 2, [1.0, 0.0, 0.0], "grad-recursive", tau=0.01)
    with pytest.raises(NumericalFailureError) as plain:
        st.soft_topk(bad, 2, "grad-recursive", tau=0.01)
    assert str(fused.value) == str(plain.value)


# ---------------------------------------------------------------------------------------------
# grad-recursive: rows certified by the running error bound skip the exact comparison


def _check_every_row(z: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, dict[int, str]]:
    """``(codes, p, messages)`` of comparing every returned row with ``grad`` (no certification)."""
    from topk_cli.operators import grad_recursive as g

    rec = g._run_recursion(z, k)
    exact = g._grad_forward(z, k)
    code = rec.trace.kind.copy()
    with np.errstate(invalid="ignore"):
        deviation = np.max(np.abs(rec.p - exact.p), axis=-1)
    cancel = (code == "ok") & ~(deviation <= CANCELLATION_TOLERANCE)
    code[cancel] = "cancellation"
    level = np.where(cancel, rec.min_level, rec.trace.failed_level)
    value = np.where(cancel, rec.trace.min_argument, rec.trace.argument)
    entry = np.where(cancel, rec.min_entry, rec.entry)
    messages = {
        int(b): g._recursion_message(str(code[b]), int(level[b]), int(entry[b]), float(value[b]), float(deviation[b]))
        for b in np.flatnonzero(code != "ok")
    }
    return code, np.where((code != "ok")[:, None], np.nan, rec.p), messages


def test_certified_rows_give_the_same_report_as_checking_every_row(monkeypatch: pytest.MonkeyPatch) -> None:
    from topk_cli.operators import grad_recursive as g

    checked: list[int] = []
    exact = g._grad_forward

    def counting(z: np.ndarray, k: int) -> g.Forward:
        checked.append(z.shape[0])
        return exact(z, k)

    rng = np.random.default_rng(31)
    codes: set[str] = set()
    rows = 0
    for n, k in ((6, 2), (12, 5), (40, 20), (60, 3), (100, 10), (200, 58)):
        x = rng.normal(size=(24, n)) * np.logspace(-1, 3, 24)[:, None]
        x[::5, 0] = x[::5, 1]
        x[::6] = np.round(x[::6])
        x[1::4, -1] = -np.inf
        z = np.where(np.isfinite(x), x - x.max(axis=-1, keepdims=True), -np.inf)
        want_code, want_p, want_messages = _check_every_row(z, k)
        monkeypatch.setattr(g, "_grad_forward", counting)
        got = g._recursive_forward(z, k)
        monkeypatch.setattr(g, "_grad_forward", exact)
        np.testing.assert_array_equal(got.code, want_code)
        np.testing.assert_array_equal(got.p, want_p)
        assert got.messages == want_messages
        codes |= set(want_code.tolist())
        rows += z.shape[0]
    assert {"ok", "log0", "cancellation"} <= codes  # every path is exercised
    assert sum(checked) < rows // 2  # the exact program ran on a minority of the rows


def test_running_bound_holds_against_the_reference() -> None:
    """Where the bound is finite it bounds the recursion's error on p (absolute) and on
    fl(1 - p) (relative), against the independent mpmath reference."""
    from topk_cli.operators import grad_recursive as g

    rng = np.random.default_rng(32)
    certified = 0
    for n, k in ((5, 2), (8, 3), (12, 6), (12, 1)):
        x = rng.normal(size=(10, n)) * np.logspace(-1, 1.5, 10)[:, None]
        z = x - x.max(axis=-1, keepdims=True)
        rec = g._run_recursion(z, k)
        for b in np.flatnonzero(np.isfinite(rec.p_bound) & (rec.trace.kind == "ok")):
            p_ref, q_ref = (np.array(ref.to_floats(v)) for v in ref.grad_with_complement_esp(list(z[b]), k))
            assert np.max(np.abs(rec.p[b] - p_ref)) <= rec.p_bound[b]
            assert np.max(np.abs(rec.q[b] - q_ref) / q_ref) <= rec.q_bound[b]
            certified += bool(rec.p_bound[b] <= CANCELLATION_TOLERANCE)
    assert certified >= 20


def test_recursive_complement_of_a_saturated_weight_keeps_its_digits() -> None:
    """fl(1 - p) is used only where it is relatively accurate: not next to p = 1."""
    for x, tau in (([0.0, 1.0, 2.0], 0.02), ([-15.0, -14.0, 0.0], 1.0)):  # 1 - p = 1e-22, 8e-7
        res = st.evaluate(x, 1, "grad-recursive", tau=tau)
        assert res.ok
        q_top = ref.grad_with_complement_esp(x, 1, tau)[1][2]
        assert abs(res.complement[2] / float(q_top) - 1) < 1e-12
    easy = st.evaluate([0.0, 0.3, -0.2, 0.1], 2, "grad-recursive")  # certified: its own fl(1 - p)
    np.testing.assert_allclose(easy.complement, st.evaluate([0.0, 0.3, -0.2, 0.1], 2, "grad").complement, rtol=1e-13)


def test_long_rows_cut_into_blocks_agree_with_the_log_space_program() -> None:
    """A few long rows run as blocks side by side (products of the blocks' count polynomials):
    same p, relatively accurate 1 - p, and the same tangent as the independent log-space program."""
    from topk_cli.operators import _poisson
    from topk_cli.operators.gradtopk import _logspace_rows, _start_tilt

    rng = np.random.default_rng(33)
    for rows, n, k, scale in ((1, 1000, 7, 1.0), (2, 700, 30, 4.0)):
        assert _poisson._block_count(rows, n, k) >= 2  # the blocked path is the one under test
        z = rng.normal(size=(rows, n)) * scale
        z[:, ::9] = -np.inf
        z = z - np.max(z, axis=1, keepdims=True)
        v = np.where(np.isfinite(z), rng.normal(size=z.shape), 0.0)
        res = _poisson.marginals(z, k, _start_tilt(z, k), v)
        lp, lq, ldp = _logspace_rows(z, k, v)
        assert res.certified.all() and res.dp is not None and ldp is not None
        assert np.max(np.abs(res.p - lp)) <= 1e-14
        assert np.max(np.abs(res.q - lq) / lq) <= 1e-12
        scale_dp = lp * lq * np.abs(v).sum(axis=1, keepdims=True)
        assert np.max(np.abs(res.dp - ldp) / np.maximum(scale_dp, 1e-300)) <= 1e-13
    x = rng.normal(size=600)
    np.testing.assert_allclose(st.soft_topk(x, 5, "grad"), ref.to_floats(ref.grad(list(x), 5)), rtol=0, atol=1e-14)


def test_numpy_sums_a_contiguous_last_axis_pairwise() -> None:
    """The running bound of grad-recursive counts (log2 n + 30) u for a row sum, which holds for
    numpy's pairwise summation, not for left-to-right addition (1 + u/2 + u/2 + ... stays 1)."""
    x = np.full((3, 1025), 2.0**-53)
    x[:, 0] = 1.0
    assert np.all(x.sum(axis=-1) - 1.0 >= 1000 * 2.0**-53)  # left to right would give 0
