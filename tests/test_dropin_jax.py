"""The JAX drop-in ``topk_cli.jax.soft_topk`` against the numpy engine.

Every drop-in method on the adversarial cases of ``dropin_cases`` (offset 1e6, spread 1e3, ties
straddling rank k, k = 1, k = n, masks, real and per-row k, per-row tau, batch shape (2, 3, n)):
float64 within 1e-12 of ``topk_cli.soft_topk`` / ``topk_cli.vjp`` (relative to the max-norm of the
reference, at least 1), float32 within a few hundred float32 ulps; ``check_grads`` in reverse mode;
``jax.jit`` and ``jax.vmap`` give the eager numbers; bfloat16 in gives bfloat16 out; bad arguments
raise the numpy API's error classes.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
from dropin_cases import Case, cases, error, reference, stacked  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import topk_cli as st  # noqa: E402
import topk_cli.jax as tj  # noqa: E402
from topk_cli.frameworks.dropin_common import dropin_methods, takes_real_k  # noqa: E402

METHODS = dropin_methods()
CASES = cases()
F32 = float(np.finfo(np.float32).eps)


def _args(case: Case, method: str, dtype):
    batch = case.x.shape[:-1]
    x = jnp.asarray(case.x, dtype=dtype)
    tau = jnp.asarray(np.broadcast_to(case.tau, batch), dtype=dtype)
    k = jnp.asarray(np.broadcast_to(case.k, batch), dtype=dtype) if takes_real_k(method) else int(case.k)
    return x, k, tau


def _run(case: Case, method: str, dtype, *, st_method: str = "", jit: bool = False):
    """Weights and the VJPs (x, k, tau) of ``case.v`` through the drop-in, as float64 numpy arrays."""
    x, k, tau = _args(case, method, dtype)
    real = takes_real_k(method)

    def f(x, tau, k):
        return tj.soft_topk(x, k if real else int(case.k), method, tau, straight_through=st_method or False)

    if jit:
        f = jax.jit(f)
    p, pullback = jax.vjp(f, x, tau, k if real else jnp.zeros(()))
    assert p.dtype == dtype and p.shape == x.shape
    gx, gtau, gk = pullback(jnp.asarray(case.v, dtype=dtype))
    as64 = lambda a: np.asarray(a, dtype=np.float64)  # noqa: E731
    return as64(p), {"x": as64(gx), "tau": as64(gtau), "k": as64(gk) if real else None}


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(("dtype", "tol_p", "tol_vjp"), [
    (jnp.float64, 1e-12, 1e-12), (jnp.float32, 64 * F32, 1024 * F32),
], ids=["float64", "float32"])
def test_matches_the_numpy_engine(method: str, dtype, tol_p: float, tol_vjp: float) -> None:
    """All the cases in one padded batch (one compilation per method and dtype)."""
    case = stacked(method)
    assert case.x.shape[0] >= (20 if takes_real_k(method) else 12), case.x.shape  # the cases are there
    if dtype == jnp.float32:
        case = Case(case.name, case.x.astype(np.float32).astype(np.float64), case.k, case.tau, case.v)
    p_ref, g_ref = reference(case, method)
    p, g = _run(case, method, dtype)
    assert error(p, p_ref) <= tol_p, error(p, p_ref)
    assert (p[np.isneginf(case.x)] == 0).all()  # masked entries weigh exactly 0
    for key in ("x", "tau", "k"):
        if g[key] is not None:
            assert error(g[key], g_ref[key]) <= tol_vjp, (key, error(g[key], g_ref[key]))


@pytest.mark.parametrize("case", [c for c in CASES if c.x.ndim != 2], ids=lambda c: c.name)
def test_batch_shapes_and_scalar_arguments(case: Case) -> None:
    """A vector and a (2, 3, n) batch, with k and tau as numbers where the case has one."""
    method = "thre-laplace"
    p_ref, _ = reference(case, method)
    p = tj.soft_topk(jnp.asarray(case.x), case.k if np.ndim(case.k) else float(case.k), method, case.tau)
    assert p.shape == case.x.shape and error(p, p_ref) <= 1e-12


def test_jit_and_vmap_give_the_eager_numbers() -> None:
    case = CASES[9]  # batch (2, 3, n), per-row k
    method = "thre-exp"  # the adapter is the same for every method: one (compile time)
    x, k, tau = _args(case, method, jnp.float64)
    eager = tj.soft_topk(x, k, method, tau)
    f = lambda x, k, tau: tj.soft_topk(x, k, method, tau)  # noqa: E731
    assert error(jax.jit(f)(x, k, tau), np.asarray(eager)) <= 1e-14
    assert error(jax.vmap(f)(x, k, tau), np.asarray(eager)) <= 1e-14
    g = jax.grad(lambda x, k, tau: jnp.sum(f(x, k, tau) * case.v), argnums=(0, 1, 2))
    for a, b in zip(jax.jit(g)(x, k, tau), g(x, k, tau)):
        assert error(a, np.asarray(b)) <= 1e-14


def test_straight_through_is_the_hard_forward_and_the_soft_gradient() -> None:
    soft = "thre-laplace"  # every soft method is checked through the PyTorch drop-in; one here (compile time)
    case = stacked(soft)
    p_ref, _ = reference(case, "hard")
    _, g_ref = reference(case, "hard", soft)
    p, g = _run(case, "hard", jnp.float64, st_method=soft)
    assert error(p, p_ref) <= 1e-12
    for key in ("x", "tau", "k"):
        assert error(g[key], g_ref[key]) <= 1e-12, key
    x = jnp.asarray(case.x)
    g_true = jax.grad(lambda x: jnp.sum(tj.soft_topk(x, case.k, "hard", case.tau, straight_through=True) * case.v))(x)
    assert error(g_true, g["x"]) == 0.0  # True means thre-laplace


@pytest.mark.parametrize("method", ["thre-laplace", "hard"])  # each method's VJPs are compared with the engine's above
def test_check_grads(method: str) -> None:
    x = jnp.array([[0.1, 1.3, -0.7, 2.2, 0.9], [1.0, -1.2, 0.4, 0.0, -2.5]])
    tau = jnp.array([0.7, 1.3])
    if takes_real_k(method) and method != "hard":
        check_grads(lambda x, k, tau: tj.soft_topk(x, k, method, tau), (x, jnp.array([2.5, 1.5]), tau),
                    order=1, modes=["rev"])
    else:  # hard: piecewise constant in x and tau (its k-derivative is compared with the engine's above)
        check_grads(lambda x, tau: tj.soft_topk(x, 2, method, tau), (x, tau), order=1, modes=["rev"])


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_precision_is_solved_in_float32(dtype) -> None:
    x = jnp.asarray(CASES[3].x, dtype=dtype)
    method = "thre-laplace"
    p = tj.soft_topk(x, 2, method, 0.5)
    assert p.dtype == dtype
    want = tj.soft_topk(x.astype(jnp.float32), 2, method, 0.5).astype(dtype)
    assert bool((p == want).all())
    g = jax.grad(lambda x: jnp.sum(tj.soft_topk(x, 2, method, 0.5).astype(jnp.float32) ** 2))(x)
    assert g.dtype == dtype and bool(jnp.isfinite(g).all())


@pytest.mark.parametrize(("call", "cls", "words"), [
    (lambda x: tj.soft_topk(x, 2, "ot-sinkhorn"), st.InvalidArgumentError, "drop-in methods: hard"),
    (lambda x: tj.soft_topk(x, 2, "nope"), st.UnknownMethodError, "drop-in methods: hard"),
    (lambda x: tj.soft_topk(x, 2.5, "grad"), st.InvalidArgumentError, "methods that take a real k: hard"),
    (lambda x: tj.soft_topk(x, jnp.array([2, 2]), "grad"), st.InvalidArgumentError, "static under tracing"),
    (lambda x: tj.soft_topk(x, 0, "grad"), st.InvalidArgumentError, "1 <= k <= n (n=5), got 0"),
    (lambda x: tj.soft_topk(x, 0, "hard"), st.InvalidArgumentError, "0 < k <= n (n=5)"),
    (lambda x: tj.soft_topk(x, 5.5, "thre-exp"), st.InvalidArgumentError, "0 < k <= n (n=5), got 5.5"),
    (lambda x: tj.soft_topk(x, jnp.array([1.0, 5.5]), "hard"), st.InvalidArgumentError, "in every row, got 5.5 at row (1,)"),
    (lambda x: tj.soft_topk(x, jnp.array([1.0, 2.0, 3.0]), "hard"), st.InvalidArgumentError, "does not broadcast"),
    (lambda x: tj.soft_topk(x, 2, "hard", -1.0), st.InvalidArgumentError, "tau must be a finite number > 0"),
    (lambda x: tj.soft_topk(x, 2, "hard", jnp.array([1.0, 0.0])), st.InvalidArgumentError, "at row (1,)"),
    (lambda x: tj.soft_topk(jnp.where(x > 1.0, jnp.inf, x), 2, "hard"), st.InvalidArgumentError, "NaN or +inf"),
    (lambda x: tj.soft_topk(jnp.where(x > 0.0, -jnp.inf, x), 3, "hard"), st.InvalidArgumentError,
     "unmasked entries (-inf = masked), fewer than k=3"),
    (lambda x: tj.soft_topk(x, 2, "thre-cube", straight_through="thre-exp"), st.InvalidArgumentError, "method='hard' only"),
    (lambda x: tj.soft_topk(x.astype(jnp.int32), 2, "hard"), st.InvalidArgumentError, "floating-point"),
    (lambda x: tj.soft_topk(x[0, 0], 1, "hard"), st.InvalidArgumentError, "at least one axis"),
])
def test_errors(call, cls: type, words: str) -> None:
    x = jnp.array([[0.1, 1.3, -0.7, 2.2, 0.9], [1.0, -1.2, 0.4, 0.0, -2.5]])
    with pytest.raises(cls) as info:
        call(x)
    assert words in str(info.value), str(info.value)


def test_value_checks_are_skipped_under_jit() -> None:
    """Under jax.jit the values are unknown: a bad k is not refused (documented), a bad shape is."""
    x = jnp.array([[0.1, 1.3, -0.7]])
    jax.jit(lambda x, k: tj.soft_topk(x, k, "hard"))(x, jnp.array([9.0]))  # not checked: traced
    with pytest.raises(st.InvalidArgumentError, match="does not broadcast"):
        jax.jit(lambda x, k: tj.soft_topk(x, k, "hard"))(x, jnp.array([1.0, 2.0]))
