"""The PyTorch drop-in ``topk_cli.torch.soft_topk`` against the numpy engine.

Every drop-in method on the adversarial cases of ``dropin_cases`` (offset 1e6, spread 1e3, ties
straddling rank k, k = 1, k = n, masks, real and per-row k, per-row tau, batch shape (2, 3, n)):
float64 within 1e-12 of ``topk_cli.soft_topk`` / ``topk_cli.vjp`` (relative to the max-norm of the
reference, at least 1), float32 within a few hundred float32 ulps; the registered operator passes
``torch.library.opcheck`` and ``gradcheck``; ``torch.compile`` gives the eager numbers; bfloat16 in
gives bfloat16 out; bad arguments raise the numpy API's error classes.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dropin_cases import Case, cases, error, reference  # noqa: E402

import topk_cli as st  # noqa: E402
import topk_cli.torch as tt  # noqa: E402
from topk_cli.frameworks.dropin_common import dropin_methods, takes_real_k  # noqa: E402

METHODS = dropin_methods()
SOFT = tuple(m for m in METHODS if m != "hard")
CASES = cases()
F32 = float(np.finfo(np.float32).eps)


def _run(case: Case, method: str, dtype: torch.dtype, *, st_method: str = "", device: str = "cpu"):
    """Weights and the VJPs (x, k, tau) of ``case.v`` through the drop-in, as float64 numpy arrays."""
    x = torch.tensor(case.x, dtype=dtype, device=device, requires_grad=True)
    batch = case.x.shape[:-1]
    tau = torch.tensor(np.broadcast_to(case.tau, batch).copy(), dtype=dtype, device=device, requires_grad=True)
    wrt = [x, tau]
    if takes_real_k(st_method or method):  # k as a tensor: its gradient is checked too
        k = torch.tensor(np.broadcast_to(case.k, batch).copy(), dtype=dtype, device=device, requires_grad=True)
        wrt.append(k)
    else:
        k = int(case.k)
    p = tt.soft_topk(x, k, method, tau, straight_through=st_method or False)
    assert p.dtype == dtype and p.shape == x.shape and p.device == x.device
    v = torch.tensor(case.v, dtype=dtype, device=device)
    grads = torch.autograd.grad(p, wrt, v)
    out = {"x": grads[0], "tau": grads[1], "k": grads[2] if len(grads) > 2 else None}
    return p.detach().cpu().double().numpy(), {
        key: None if g is None else g.detach().cpu().double().numpy() for key, g in out.items()
    }


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(("dtype", "tol_p", "tol_vjp"), [
    (torch.float64, 1e-12, 1e-12), (torch.float32, 64 * F32, 1024 * F32),
], ids=["float64", "float32"])
def test_matches_the_numpy_engine(method: str, dtype: torch.dtype, tol_p: float, tol_vjp: float) -> None:
    checked = 0
    for case in CASES:
        if not case.applies_to(method):
            continue
        data = case if dtype == torch.float64 else Case(case.name, case.x.astype(np.float32).astype(np.float64),
                                                       case.k, case.tau, case.v)
        p_ref, g_ref = reference(data, method)
        p, g = _run(data, method, dtype)
        assert error(p, p_ref) <= tol_p, (case.name, error(p, p_ref))
        masked = np.isneginf(case.x)
        assert (p[masked] == 0).all(), case.name  # masked entries weigh exactly 0
        for key in ("x", "tau", "k"):
            if g[key] is not None:
                assert error(g[key], g_ref[key]) <= tol_vjp, (case.name, key, error(g[key], g_ref[key]))
        checked += 1
    assert checked >= (len(CASES) if takes_real_k(method) else 7), checked


@pytest.mark.parametrize("soft", SOFT)
def test_straight_through_is_the_hard_forward_and_the_soft_gradient(soft: str) -> None:
    checked = 0
    for case in CASES:
        if not case.applies_to(soft):
            continue
        p_ref, _ = reference(case, "hard")
        _, g_ref = reference(case, "hard", soft)
        p, g = _run(case, "hard", torch.float64, st_method=soft)
        assert error(p, p_ref) <= 1e-12, case.name
        for key in ("x", "tau"):
            assert error(g[key], g_ref[key]) <= 1e-12, (case.name, key)
        checked += 1
    assert checked >= 7


def test_straight_through_true_is_thre_laplace() -> None:
    x = torch.tensor([[0.3, 2.0, -1.0, 1.5]], dtype=torch.float64, requires_grad=True)
    (g_true,) = torch.autograd.grad(tt.soft_topk(x, 2, "hard", straight_through=True)[0, 0], x)
    (g_named,) = torch.autograd.grad(tt.soft_topk(x, 2, "hard", straight_through="thre-laplace")[0, 0], x)
    assert torch.equal(g_true, g_named) and bool(g_true.abs().sum() > 0)


def test_numbers_and_tensors_give_the_same_bits() -> None:
    x = torch.tensor(CASES[0].x)
    for method in METHODS:
        k = 2.5 if takes_real_k(method) else 2
        a = tt.soft_topk(x, k, method, 0.5)
        b = tt.soft_topk(x, torch.full(x.shape[:-1], float(k), dtype=torch.float64), method, torch.tensor(0.5)) \
            if takes_real_k(method) else tt.soft_topk(x, k, method, torch.full((x.shape[0], 1), 0.5))
        assert torch.equal(a, b), method


def _small(method: str):
    x = torch.tensor([[0.1, 1.3, -0.7, 2.2, 0.9], [1.0, -1.2, 0.4, 0.0, -2.5]], dtype=torch.float64)
    k = torch.tensor([2.5, 1.5], dtype=torch.float64) if takes_real_k(method) else torch.tensor([2.0, 2.0])
    return x, k, torch.tensor([0.7, 1.3], dtype=torch.float64)


@pytest.mark.parametrize("method", METHODS)
def test_opcheck(method: str) -> None:
    x, k, tau = _small(method)
    k_static = 0 if takes_real_k(method) else 2
    torch.library.opcheck(tt._soft_topk_op, (x, k.double(), tau, method, "", k_static, 0.0))
    if method == "hard":
        torch.library.opcheck(tt._soft_topk_op, (x, k.double(), tau, method, "thre-laplace", 0, 0.0))
        torch.library.opcheck(tt._soft_topk_op, (x, torch.full((2,), 2.0, dtype=torch.float64), tau, method, "grad", 2, 0.0))
    # a bound on k (the partial selection instead of a sort): rows long enough that it is taken
    long = torch.cat([x, x - 3.0, x - 6.0, x - 9.0], dim=1)
    torch.library.opcheck(tt._soft_topk_op, (long, k.double(), tau, method, "", k_static, 2.5))


@pytest.mark.parametrize("method", METHODS)
def test_gradcheck(method: str) -> None:
    x, k, tau = _small(method)
    x.requires_grad_(True)
    tau.requires_grad_(True)
    if takes_real_k(method) and method != "hard":
        k.requires_grad_(True)
        inputs = (x, k, tau)
        assert torch.autograd.gradcheck(lambda x, k, tau: tt.soft_topk(x, k, method, tau), inputs)
    else:  # grad: integer k, no derivative; hard: checked with respect to x and tau at an integer k
        assert torch.autograd.gradcheck(lambda x, tau: tt.soft_topk(x, 2, method, tau), (x, tau))


def test_compile_keeps_one_graph_and_the_eager_numbers() -> None:
    case = CASES[7]  # per-row k and tau
    for method in ("thre-laplace" if "thre-laplace" in METHODS else SOFT[0], "grad" if "grad" in METHODS else "hard"):
        def f(x, k, tau, method=method):
            return tt.soft_topk(x, k if takes_real_k(method) else 2, method, tau)

        compiled = torch.compile(f, backend="aot_eager", fullgraph=True)  # fullgraph: a graph break fails
        args = [torch.tensor(a, requires_grad=True) for a in (case.x, np.asarray(case.k, float), np.asarray(case.tau))]
        eager = f(*args)
        got = compiled(*args)
        assert torch.equal(got, eager), method
        v = torch.tensor(case.v)
        g_eager = torch.autograd.grad(eager, args, v, allow_unused=True)
        g_got = torch.autograd.grad(compiled(*args), args, v, allow_unused=True)
        for a, b in zip(g_eager, g_got):
            assert (a is None and b is None) or torch.equal(a, b), method


def test_compile_with_numbers_for_k_and_tau_keeps_one_graph() -> None:
    """Regression: the checks of a number k or tau used numpy, which dynamo traced into a
    data-dependent branch (a graph break, an error with fullgraph=True)."""
    x = torch.tensor(CASES[0].x, requires_grad=True)

    def f(x):
        return tt.soft_topk(x * 2.0, 2.5, "thre-sigmoid", 0.5)

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x), f(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_is_solved_in_float32(dtype: torch.dtype) -> None:
    x = torch.tensor(CASES[3].x, dtype=dtype, requires_grad=True)
    for method in METHODS:
        p = tt.soft_topk(x, 2, method, 0.5, straight_through="thre-laplace" if method == "hard" else False)
        assert p.dtype == dtype
        want = tt.soft_topk(x.detach().float(), 2, method, 0.5).to(dtype)
        assert torch.equal(p, want), method
        (g,) = torch.autograd.grad(p.float().pow(2).sum(), x)
        assert g.dtype == dtype and bool(torch.isfinite(g).all()), method


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_runs_on_the_inputs_device(device: str) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    case = CASES[7]
    for method in METHODS:
        if not case.applies_to(method):
            case = CASES[0]
        p_ref, g_ref = reference(case, method)
        p, g = _run(case, method, torch.float64, device=device)
        assert error(p, p_ref) <= 1e-12, method
        assert error(g["x"], g_ref["x"]) <= 1e-12, method


@pytest.mark.parametrize(("call", "cls", "words"), [
    (lambda x: tt.soft_topk(x, 2, "ot-sinkhorn"), st.InvalidArgumentError, "drop-in methods: hard"),
    (lambda x: tt.soft_topk(x, 2, "nope"), st.UnknownMethodError, "drop-in methods: hard"),
    (lambda x: tt.soft_topk(x, 2.5, "grad"), st.InvalidArgumentError, "methods that take a real k: hard"),
    (lambda x: tt.soft_topk(x, 2.5, "hard", straight_through="grad"), st.InvalidArgumentError, "for method 'grad'"),
    (lambda x: tt.soft_topk(x, torch.tensor([2.0, 2.0]), "grad"), st.InvalidArgumentError, "k must be a number"),
    (lambda x: tt.soft_topk(x, 0, "grad"), st.InvalidArgumentError, "1 <= k <= n (n=5), got 0"),
    (lambda x: tt.soft_topk(x, 0, "hard"), st.InvalidArgumentError, "0 < k <= n (n=5)"),
    (lambda x: tt.soft_topk(x, 6, "thre-laplace"), st.InvalidArgumentError, "0 < k <= n (n=5), got 6"),
    (lambda x: tt.soft_topk(x, float("nan"), "thre-exp"), st.InvalidArgumentError, "0 < k <= n (n=5), got nan"),
    (lambda x: tt.soft_topk(x, torch.tensor([1.0, 5.5]), "hard"), st.InvalidArgumentError, "in every row, got 5.5 at row (1,)"),
    (lambda x: tt.soft_topk(x, torch.tensor([1.0, 2.0, 3.0]), "hard"), st.InvalidArgumentError, "does not broadcast"),
    (lambda x: tt.soft_topk(x, 2, "hard", 0.0), st.InvalidArgumentError, "tau must be a finite number > 0"),
    (lambda x: tt.soft_topk(x, 2, "hard", torch.tensor([1.0, -1.0])), st.InvalidArgumentError, "at row (1,)"),
    (lambda x: tt.soft_topk(x.masked_fill(x > 1.0, float("nan")), 2, "hard"), st.InvalidArgumentError, "NaN or +inf"),
    (lambda x: tt.soft_topk(x.masked_fill(x > 0.0, float("-inf")), 3, "hard"), st.InvalidArgumentError,
     "unmasked entries (-inf = masked), fewer than k=3"),
    (lambda x: tt.soft_topk(x, 2, "thre-laplace", straight_through=True), st.InvalidArgumentError, "method='hard' only"),
    (lambda x: tt.soft_topk(x, 2, "hard", straight_through="hard"), st.InvalidArgumentError, "soft drop-in method"),
    (lambda x: tt.soft_topk(x.numpy(), 2, "hard"), st.InvalidArgumentError, "torch.Tensor"),
    (lambda x: tt.soft_topk(x.long(), 2, "hard"), st.InvalidArgumentError, "floating-point"),
    (lambda x: tt.soft_topk(x[0, 0], 1, "hard"), st.InvalidArgumentError, "at least one axis"),
    (lambda x: tt.soft_topk(x, torch.tensor([True, False]), "hard"), st.InvalidArgumentError, "real numbers"),
])
def test_errors(call, cls: type, words: str) -> None:
    x, _, _ = _small("hard")
    with pytest.raises(cls, match=None) as info:
        call(x)
    assert words in str(info.value), str(info.value)
