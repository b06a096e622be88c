"""Measured properties of the top-k operators: ``check_<property>() -> PropertyResult``.

One implementation, two uses: ``softtopk verify-properties`` runs these checks on a
deterministic adversarial suite (or the user's vectors), and the hypothesis tests in
``tests/test_properties.py`` run the very same checks on generated inputs. A verdict is always
*measured* on inputs; the registry's claims (:class:`topk_cli.registry.Guarantees`) are only what
each verdict is compared with.

Every check takes a method name and a sequence of :class:`Case` (a vector ``x``, ``k`` and
``tau``) and returns a frozen :class:`PropertyResult`: ``holds`` (``None`` when no case was
applicable), the worst violation seen, and, when the property fails, a shrunk
:class:`Counterexample` (fewest entries, simplest values) that reproduces with
``softtopk compute``. Definitions (``p = ST(x / tau)``, ``q = 1 - p`` computed accurately):

* ``range``: ``0 <= p_i <= 1`` (tolerance 1e-12); ``sum``: ``|sum p - k| <= 1e-12 k``;
* ``monotone-weak``: ``x_i > x_j => p_i >= p_j`` (tolerance 1e-12);
* ``monotone-strict``: ``x_i > x_j => p_i > p_j``, judged on ``k < n`` and on pairs that
  float64 can resolve: ``p_i == p_j`` with ``q_i < q_j`` is strict (saturation at 1 hides it
  in ``p`` only); ``p_i == p_j`` and ``q_i == q_j`` at exactly 0 or 1 is counted only when the
  row's span ``(max z - min z) < 600`` (otherwise it may be underflow of an exact value
  below 1e-308, which float64 cannot tell apart); the worst violation is the largest gap
  ``x_i - x_j`` that was not separated;
* ``shift-invariant``: ``ST(x + c) = ST(x)`` for exactly representable shifts (tolerance 1e-12);
* ``permutation-equivariant``: ``ST(x[perm]) = ST(x)[perm]`` (tolerance 1e-12);
* ``hard-limit``: where ``x_(k) > x_(k+1)``, ``max |ST(x / tau) - T_k(x)| <= 1e-6`` at
  ``tau = 1e-3 * g``, ``g`` the smallest positive gap between distinct entries (so every
  ordering is resolved by >= 1000 in z: the sequential methods need all of them); a method that
  fails numerically there (``grad-recursive``) does not deliver the limit: a violation;
* ``softmax-at-k1``: at ``k = 1``, ``max |p - softmax(z)| <= 1e-12``;
* ``smooth``: C1 or better, measured along random lines through candidate kinks (ties at the
  k-th value and at the minimum, ``p_i = 1/2``, the edges of exact saturation ``p_i = 1`` and
  ``p_i = 0``) with one-sided finite differences at two step sizes; the class reported is the
  worst seen: ``discontinuous`` (a jump in p, or a pole), ``C0`` (a jump in dp), ``C1`` (a jump
  in d2p) or ``C-infinity`` (no discontinuity detected up to the second derivative). A line on
  which the method refuses a point is no evidence of smoothness (skipped), unless the refusal
  is ``inf``/``ill-conditioned`` and p grows like ``1/t`` toward the refused stretch from both
  sides (a pole, ``weighted-softmax`` at k >= 3); refused suite cases and refused points on
  rays ``max x + c (x - max x)`` are probed for poles too;
* ``jacobian``: ``topk_cli.jacobian`` against finite differences (step ~1e-5 in z, Richardson
  extrapolated), ``max |J - J_fd| * tau <= 1e-6 * max(1, max |J| tau)`` beyond the differences'
  own uncertainty ``4 |C(h) - C(2h)|``; at a kink along ``e_j`` (one-sided differences disagree)
  the analytic column must match one side; columns where p jumps or ``0 < 1 - p_j < 8 h / tau``
  (a saturation kink may sit under the stencil), and points with near-ties closer
  than the stencil, are skipped;
* ``finite``: the method returns finite weights; a reported numerical failure (e.g. ``log0``)
  counts as *not finite*. The other checks skip cases on which the method failed.
"""

from __future__ import annotations

import builtins
import functools
import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from topk_cli.api import TopKResult, evaluate, get_method, jacobian
from topk_cli.errors import InvalidArgumentError, NumericalFailureError, RowFailure
from topk_cli.operators._base import FloatArray
from topk_cli.registry import METHODS, SMOOTHNESS_CLASSES

#: Property names, in report order (the SPEC's JSON names).
PROPERTIES: tuple[str, ...] = (
    "range",
    "sum",
    "monotone-weak",
    "monotone-strict",
    "shift-invariant",
    "permutation-equivariant",
    "hard-limit",
    "softmax-at-k1",
    "smooth",
    "jacobian",
    "finite",
)

#: Sizes, spreads and offsets of the default adversarial suite.
SUITE_SIZES: tuple[int, ...] = (1, 2, 3, 5, 10, 50)
SUITE_SPREADS: tuple[float, ...] = (1e-3, 1e-1, 1.0, 10.0, 1e3)
SUITE_OFFSETS: tuple[float, ...] = (0.0, 1e6)

TOL_ABS = 1e-12
TOL_HARD_LIMIT = 1e-6
TOL_JACOBIAN = 1e-6
HARD_LIMIT_TAU_OVER_GAP = 1e-3
#: Rows whose span in z exceeds this may hold exact values below the float64 range.
UNDERFLOW_SPAN = 600.0
_MAX_SMOOTH_CASES = 10
_MAX_JACOBIAN_CASES = 60
_FD_STEP = 1e-5
_SMOOTH_STEP = 4e-2
#: Refusal codes a pole produces; only these are probed for one (see ``_pole_probe``).
_POLE_CODES = frozenset({"inf", "ill-conditioned"})
_POLE_GRID = 2.0 ** np.arange(-30, 3)  # distances (units of tau) at which a refused stretch ends
_POLE_GROWTH = 1.5
_POLE_EDGE = 2.0
_POLE_HUGE = 1e3
_RAY_POINTS = 64
#: At most this many suite cases refused with a pole code join the smoothness cases.
_MAX_REFUSED_SMOOTH_CASES = 4


@dataclass(frozen=True)
class Case:
    """One input of a check: the vector ``x``, ``k`` and the temperature ``tau``."""

    x: tuple[float, ...]
    k: int
    tau: float = 1.0
    label: str = ""

    @property
    def array(self) -> FloatArray:
        """``x`` as a float64 array."""
        return np.asarray(self.x, dtype=np.float64)


@dataclass(frozen=True)
class Counterexample:
    """A concrete (shrunk) input on which a property fails, ready to paste."""

    method: str
    x: tuple[float, ...]
    k: int
    tau: float
    detail: str

    @property
    def command(self) -> str:
        """The ``softtopk compute`` command that shows the failure."""
        values = ",".join(_fmt(v) for v in self.x)
        return f"softtopk compute -m {self.method} -k {self.k} --tau {_fmt(self.tau)} --values={values}"

    def as_dict(self) -> dict[str, object]:
        """JSON-able form (the ``counterexample`` object of the SPEC)."""
        return {
            "x": list(self.x), "k": self.k, "tau": self.tau, "detail": self.detail, "command": self.command,
        }


@dataclass(frozen=True)
class PropertyResult:
    """The measured verdict of one method on one property.

    ``holds`` is None when no case was applicable (e.g. ``softmax-at-k1`` without ``k = 1``);
    ``expected`` is the registry's claim; ``worst`` the largest violation measured (0 when it
    holds exactly; None when nothing was measured); ``checked``/``skipped``/``violations`` count
    cases; ``smoothness`` is the measured class (``smooth`` only).
    """

    method: str
    property: str
    expected: bool
    holds: bool | None
    worst: float | None
    counterexample: Counterexample | None
    checked: int
    skipped: int = 0
    violations: int = 0
    detail: str = ""
    smoothness: str | None = None
    expected_smoothness: str | None = None

    @builtins.property  # the field 'property' shadows the builtin in this class body
    def agrees(self) -> bool:
        """True unless the measurement contradicts the claim (not applicable agrees)."""
        if self.holds is None:
            return True
        if self.holds != self.expected:
            return False
        return self.smoothness is None or self.smoothness == self.expected_smoothness

    @builtins.property  # the field 'property' shadows the builtin in this class body
    def claim_violated(self) -> bool:
        """A property the method claims was measured to fail (``--strict`` exits 1)."""
        return self.expected and self.holds is False


@dataclass(frozen=True)
class VerifyReport:
    """Everything ``verify-properties`` measured: one result per (method, property)."""

    methods: tuple[str, ...]
    properties: tuple[str, ...]
    cases: int
    results: tuple[PropertyResult, ...]
    source: str = "suite"
    seed: int | None = None
    trials: int | None = None

    @property
    def disagreements(self) -> tuple[PropertyResult, ...]:
        """Results where the measurement contradicts the registry's claim."""
        return tuple(r for r in self.results if not r.agrees)

    @property
    def claim_failures(self) -> tuple[PropertyResult, ...]:
        """Claimed properties measured to fail."""
        return tuple(r for r in self.results if r.claim_violated)


@dataclass(frozen=True)
class _Measure:
    """Violation of one case: ``value`` (0 = fine), whether the method failed, a sentence."""

    value: float
    failed: bool = False
    detail: str = ""
    tau: float | None = None
    extra: dict[str, object] = field(default_factory=dict)


_Violation = Callable[[str, FloatArray, int, float], "_Measure | None"]


def _fmt(v: float) -> str:
    """Shortest text that reads back as the same float64 (``2`` for 2.0)."""
    text = repr(float(v))
    return text[:-2] if text.endswith(".0") else text


def _vec(a: ArrayLike, digits: int = 4) -> str:
    arr = np.asarray(a, dtype=np.float64)
    return "[" + ", ".join(f"{float(v):.{digits}g}" for v in arr) + "]"


# ---- evaluation (memoised: several checks look at the same case) ----------------------------


@dataclass(frozen=True)
class _Row:
    """One evaluated row, shaped like a one-row :class:`TopKResult`."""

    weights: FloatArray  # (1, n)
    complement: FloatArray  # (1, n)
    failures: tuple[RowFailure, ...]


_Key = tuple[str, bytes, int, int, float]
_CACHE: dict[_Key, _Row] = {}
_CACHE_LIMIT = 200_000


def _key(method: str, x: FloatArray, k: int, tau: float) -> _Key:
    return (method, np.ascontiguousarray(x, dtype=np.float64).tobytes(), x.shape[-1], k, float(tau))


def _prefetch(method: str, items: Sequence[tuple[FloatArray, int, float]]) -> None:
    """Evaluate many single vectors in batches of equal (n, k, tau): one API call per batch."""
    if len(_CACHE) > _CACHE_LIMIT:
        _CACHE.clear()
    groups: dict[tuple[int, int, float], dict[_Key, FloatArray]] = {}
    for x, k, tau in items:
        key = _key(method, x, k, tau)
        if key not in _CACHE:
            groups.setdefault((x.shape[-1], k, float(tau)), {})[key] = x
    for (_, k, tau), rows in groups.items():
        batch = np.vstack(list(rows.values()))
        r = evaluate(batch, k, method, tau=tau)
        by_row = {f.row[0]: f for f in r.failures}
        weights = np.asarray(r.weights, dtype=np.float64)
        for i, key in enumerate(rows):
            failure = (by_row[i],) if i in by_row else ()
            _CACHE[key] = _Row(weights[i : i + 1], r.complement[i : i + 1], failure)


def _eval(method: str, x: FloatArray, k: int, tau: float) -> _Row:
    key = _key(method, x, k, tau)
    if key not in _CACHE:
        _prefetch(method, [(x, k, tau)])
    return _CACHE[key]


def _z(x: FloatArray, tau: float) -> FloatArray:
    """The scaled scores the API computes: ``(x - max finite x) / tau``."""
    finite = np.isfinite(x)
    top = np.max(x[finite]) if finite.any() else 0.0
    with np.errstate(over="ignore", invalid="ignore"):  # -inf stays -inf; huge spreads saturate
        return np.where(finite, (x - top) / tau, -np.inf)


def _hard(x: FloatArray, k: int) -> FloatArray:
    """``T_k(x)`` with ties at the k-th value sharing the remaining mass."""
    kth = -np.partition(-x, k - 1)[k - 1]
    above = x > kth
    at = x == kth
    return np.where(above, 1.0, np.where(at, (k - above.sum()) / at.sum(), 0.0))


def _softmax(z: FloatArray) -> FloatArray:
    e = np.exp(z - np.max(z))
    return e / e.sum()


def _failed(r: _Row, tau: float) -> _Measure:
    f = r.failures[0]
    return _Measure(value=math.nan, failed=True, detail=f"the method failed ({f.code}): {f.detail}", tau=tau)


# ---- violations of one case -------------------------------------------------------------------


def _v_range(method: str, x: FloatArray, k: int, tau: float) -> _Measure | None:
    r = _eval(method, x, k, tau)
    if r.failures:
        return _failed(r, tau)
    p, q = r.weights[0], r.complement[0]
    below, above = -float(p.min()), max(float(p.max()) - 1.0, -float(q.min()))
    if below >= above:
        i = int(np.argmin(p))
        return _Measure(max(0.0, below), detail=f"p[{i}] = {p[i]:.6g} < 0")
    i = int(np.argmax(p - 1.0)) if float(p.max()) - 1.0 >= -float(q.min()) else int(np.argmin(q))
    return _Measure(max(0.0, above), detail=f"p[{i}] = {p[i]:.6g} > 1 (p = {_vec(p)})")


def _v_sum(method: str, x: FloatArray, k: int, tau: float) -> _Measure | None:
    r = _eval(method, x, k, tau)
    if r.failures:
        return _failed(r, tau)
    s = float(np.sum(r.weights[0]))
    return _Measure(abs(s - k) / k, detail=f"sum p = {s:.17g}, not k = {k}")


def _ordered_pairs(z: FloatArray) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs (i, j) with z_i > z_j resolvable in float64 (finite entries only)."""
    idx = np.flatnonzero(np.isfinite(z))
    zi, zj = z[idx][:, None], z[idx][None, :]
    scale = np.maximum(1.0, np.maximum(np.abs(zi), np.abs(zj)))
    i, j = np.nonzero(zi - zj > 1e-9 * scale)
    return idx[i], idx[j]


def _v_monotone_weak(method: str, x: FloatArray, k: int, tau: float) -> _Measure | None:
    n = x.shape[-1]
    if n < 2:
        return None
    r = _eval(method, x, k, tau)
    if r.failures:
        return _failed(r, tau)
    p = r.weights[0].astype(np.float64)
    z = _z(x, tau)
    idx = np.flatnonzero(np.isfinite(z))
    zi, zj = z[idx][:, None], z[idx][None, :]
    drop = np.where(zi > zj, p[idx][None, :] - p[idx][:, None], -np.inf)
    if not np.isfinite(drop).any():
        return None
    a, b = np.unravel_index(int(np.argmax(drop)), drop.shape)
    i, j = int(idx[a]), int(idx[b])
    return _Measure(
        max(0.0, float(drop[a, b])),
        detail=f"x[{i}] = {_fmt(x[i])} > x[{j}] = {_fmt(x[j])} but p[{i}] = {p[i]:.6g} < p[{j}] = {p[j]:.6g}",
    )


def _v_monotone_strict(method: str, x: FloatArray, k: int, tau: float) -> _Measure | None:
    n = int(np.isfinite(x).sum())
    if n < 2 or k >= n:
        return None
    z = _z(x, tau)
    i_idx, j_idx = _ordered_pairs(z)
    if i_idx.size == 0:
        return None
    r = _eval(method, x, k, tau)
    if r.failures:
        return _failed(r, tau)
    p = r.weights[0].astype(np.float64)
    q = r.complement[0]
    pi, pj, qi, qj = p[i_idx], p[j_idx], q[i_idx], q[j_idx]
    separated = (pi > pj) | (qi < qj)
    equal = (pi == pj) & (qi == qj)
    finite_z = z[np.isfinite(z)]
    span = float(finite_z.max() - finite_z.min())
    saturated = (pi == 0.0) | (qi == 0.0)
    unresolvable = equal & saturated & (span >= UNDERFLOW_SPAN)
    bad = ~separated & ~unresolvable
    if not bad.any():
        return _Measure(0.0)
    gaps = np.where(bad, x[i_idx] - x[j_idx], -np.inf)
    w = int(np.argmax(gaps))
    i, j = int(i_idx[w]), int(j_idx[w])
    if p[i] == p[j]:
        detail = f"x[{i}] = {_fmt(x[i])} > x[{j}] = {_fmt(x[j])} but p[{i}] = p[{j}] = {p[i]:.17g}"
        detail += f" and 1 - p[{i}] = {q[i]:.6g} >= 1 - p[{j}] = {q[j]:.6g}"
    else:
        detail = f"x[{i}] = {_fmt(x[i])} > x[{j}] = {_fmt(x[j])} but p[{i}] = {p[i]:.17g} < p[{j}] = {p[j]:.17g}"
    return _Measure(float(gaps[w]), detail=detail)


def _exact_shift(x: FloatArray) -> tuple[FloatArray, FloatArray, float]:
    """``(x + c, the x that float64 actually shifted, c)`` for a large c."""
    finite = np.isfinite(x)
    mag = float(np.max(np.abs(x[finite]))) if finite.any() else 0.0
    c = 1e6 if mag < 1e5 else -0.75 * mag
    with np.errstate(invalid="ignore"):  # -inf + c stays -inf
        y = x + c
        x_back = y - c
    return y, np.where(finite, x_back, -np.inf), c


def _v_shift(method: str, x: FloatArray, k: int, tau: float) -> _Measure | None:
    y, x_back, c = _exact_shift(x)
    r0, r1 = _eval(method, x_back, k, tau), _eval(method, y, k, tau)
    if r0.failures or r1.failures:
        return _failed(r0 if r0.failures else r1, tau)
    d = max(
        float(np.max(np.abs(r0.weights - r1.weights))), float(np.max(np.abs(r0.complement - r1.complement)))
    ) / max(1.0, float(np.max(np.abs(r0.weights))))
    return _Measure(d, detail=f"adding c = {_fmt(c)} changes p by up to {d:.3g} (relative to max(1, |p|))")


def _permutations(n: int) -> list[np.ndarray]:
    return [np.arange(n)[::-1], np.roll(np.arange(n), 1)]


def _v_permutation(method: str, x: FloatArray, k: int, tau: float) -> _Measure | None:
    n = x.shape[-1]
    if n < 2:
        return None
    r = _eval(method, x, k, tau)
    if r.failures:
        return _failed(r, tau)
    worst = 0.0
    detail = ""
    for perm in _permutations(n):
        rp = _eval(method, x[perm], k, tau)
        if rp.failures:
            return _failed(rp, tau)
        d = max(
            float(np.max(np.abs(rp.weights[0] - r.weights[0][perm]))),
            float(np.max(np.abs(rp.complement[0] - r.complement[0][perm]))),
        ) / max(1.0, float(np.max(np.abs(r.weights[0]))))
        if d > worst:
            worst = d
            detail = f"permuting x by {perm.tolist()} changes the permuted p by up to {d:.3g} (relative to max(1, |p|))"
    return _Measure(worst, detail=detail)


def _kth_gap(x: FloatArray, k: int) -> float | None:
    """The smallest positive gap between distinct finite values when ``x_(k) > x_(k+1)``, else None."""
    finite = np.sort(x[np.isfinite(x)])[::-1]
    if k >= finite.size:
        return None
    finite = finite - finite[0]  # the gaps the API sees after its shift
    gap = float(finite[k - 1] - finite[k])
    scale = max(abs(float(finite[k - 1])), abs(float(finite[k])), 1e-300)
    if gap <= 1e-12 * scale:
        return None
    gaps = -np.diff(finite)
    return float(gaps[gaps > 0].min())


def _v_hard_limit(method: str, x: FloatArray, k: int, tau: float) -> _Measure | None:
    gap = _kth_gap(x, k)
    if gap is None:
        return None
    small = HARD_LIMIT_TAU_OVER_GAP * gap
    r = _eval(method, _z(x, small), k, 1.0)  # bitwise the z the API computes for (x, small)
    if r.failures:
        f = r.failures[0]
        return _Measure(
            math.inf, detail=f"the method fails at tau = {small:.3g} ({f.code}): it cannot deliver the limit", tau=small
        )
    p = r.weights[0].astype(np.float64)
    hard = np.where(np.isfinite(x), _hard(np.where(np.isfinite(x), x, -np.inf), k), 0.0)
    err = float(np.max(np.abs(p - hard)))
    return _Measure(
        err,
        detail=f"at tau = {small:.3g} (1e-3 x the smallest gap) p = {_vec(np.round(p, 4))}, hard top-k = {_vec(hard)}",
        tau=small,
        extra={"limit": np.round(p, 4).tolist()},
    )


def _v_softmax_k1(method: str, x: FloatArray, k: int, tau: float) -> _Measure | None:
    if k != 1:
        return None
    r = _eval(method, x, k, tau)
    if r.failures:
        return _failed(r, tau)
    p = r.weights[0].astype(np.float64)
    s = _softmax(_z(x, tau))
    d = float(np.max(np.abs(p - s)))
    return _Measure(d, detail=f"p = {_vec(p, 6)}, softmax = {_vec(s, 6)} (max softmax weight {s.max():.4g})")


def _v_finite(method: str, x: FloatArray, k: int, tau: float) -> _Measure | None:
    r = _eval(method, x, k, tau)
    if r.failures:
        f = r.failures[0]
        return _Measure(1.0, detail=f"{f.code}: {f.detail}")
    ok = bool(np.isfinite(r.weights).all())
    return _Measure(0.0 if ok else 1.0, detail="" if ok else "non-finite weights returned with status ok")


def _v_jacobian(method: str, x: FloatArray, k: int, tau: float) -> _Measure | None:
    """Analytic Jacobian against finite differences along each coordinate ``e_j``.

    Where p is smooth along ``e_j`` (the one-sided derivatives agree) the column is compared with
    the central difference; at a kink (they disagree) with the nearer one-sided derivative,
    since the analytic Jacobian takes one side; where p jumps the column is not checked.
    """
    if not np.isfinite(x).all():
        return None
    r = _eval(method, x, k, tau)
    if r.failures:
        return _failed(r, tau)
    n = x.shape[-1]
    h = 2.0 ** round(math.log2(_FD_STEP * tau))  # a power of two: x_j +- h is exact
    gaps = np.diff(np.sort(x))
    if ((gaps > 0) & (gaps < 8 * h)).any():
        return None  # near-ties inside the stencil: several kinks could sit under it
    offsets = np.array([h, 2 * h, -h, -2 * h])
    rows = x[None, None, :] + offsets[None, :, None] * np.eye(n)[:, None, :]  # (n, 4, n)
    taken = np.einsum("jsj->js", rows - x[None, None, :])
    if not np.array_equal(taken, np.tile(offsets, (n, 1))):
        return None  # |x| too large for an exact step
    fd = evaluate(rows.reshape(4 * n, n), k, method, tau=tau)
    if fd.failures:
        return None
    g = np.asarray(fd.weights, dtype=np.float64).reshape(n, 4, n)  # g[j, s, i] = p_i(x + step_s e_j)
    p0 = r.weights[0]
    d1p, d2p, d1m, d2m = (g[:, s, :] - p0[None, :] for s in range(4))
    jump = (np.abs(d2p - 2 * d1p) > 0.5 * np.abs(d1p) + 1e-9) | (np.abs(d2m - 2 * d1m) > 0.5 * np.abs(d1m) + 1e-9)
    jumps = jump.any(axis=1)
    if jumps.all():
        return None
    right = (4 * d1p - d2p) / (2 * h)  # second-order one-sided differences, [j, i]
    left = -(4 * d1m - d2m) / (2 * h)
    central_h = (g[:, 0, :] - g[:, 2, :]) / (2 * h)
    central_2h = (g[:, 1, :] - g[:, 3, :]) / (4 * h)
    central = (4 * central_h - central_2h) / 3  # Richardson: O(h^4)
    uncertainty = 4 * np.abs(central_h - central_2h)  # what the differences themselves cannot resolve
    try:
        analytic = jacobian(x, k, method, tau=tau).astype(np.float64).T  # [j, i] = d p_i / d x_j
    except NumericalFailureError as exc:
        return _Measure(math.nan, failed=True, detail=f"the Jacobian failed: {exc}", tau=tau)
    scale = max(1.0, float(np.max(np.abs(analytic))) * tau)  # the tolerance is relative to max(1, |J| tau)
    kink = np.max(np.abs(right - left) - uncertainty, axis=1) * tau > TOL_JACOBIAN * scale
    err_right = np.max(np.abs(analytic - right), axis=1)
    err_left = np.max(np.abs(analytic - left), axis=1)
    ref = np.where((kink & (err_right <= err_left))[:, None], right, np.where(kink[:, None], left, central))
    excess = np.maximum(np.abs(analytic - ref) - np.where(kink[:, None], 0.0, uncertainty), 0.0)
    q0 = r.complement[0]
    near_edge = (q0 > 0) & (q0 < 8 * h / tau)  # a saturation kink (thre-exp) may sit under the stencil
    err = np.where(jumps | near_edge, 0.0, np.max(excess, axis=1) * tau / scale)
    j = int(np.argmax(err))
    i = int(np.argmax(excess[j]))
    side = " (one-sided, at a kink)" if kink[j] else ""
    return _Measure(
        float(err[j]),
        detail=f"dp[{i}]/dx[{j}]: analytic {analytic[j, i]:.6g}, finite differences{side} {ref[j, i]:.6g}",
    )


# ---- smoothness -------------------------------------------------------------------------------

_CLASS_RANK = {name: rank for rank, name in enumerate(SMOOTHNESS_CLASSES)}


def _bisect_entry(
    method: str, x: FloatArray, k: int, tau: float, i: int, predicate: Callable[[TopKResult], np.ndarray]
) -> FloatArray | None:
    """Move ``x_i`` to where ``predicate`` (monotone in x_i) switches from False to True."""
    finite = x[np.isfinite(x)]
    lo, hi = float(finite.min()) - 60 * tau, float(finite.max()) + 60 * tau
    for _ in range(9):
        grid = np.linspace(lo, hi, 64)
        batch = np.repeat(x[None, :], grid.size, axis=0)
        batch[:, i] = grid
        r = evaluate(batch, k, method, tau=tau)
        ok = r.status == "ok"
        if not ok.all():
            return None
        flags = predicate(r)
        if flags[0] or not flags[-1]:
            return None
        first = int(np.argmax(flags))
        lo, hi = float(grid[first - 1]), float(grid[first])
        if hi - lo <= 1e-13 * max(1.0, abs(hi)):
            break
    out = x.copy()
    out[i] = hi
    return out


def _weight_at_least(r: TopKResult, *, i: int, level: float) -> np.ndarray:
    return np.asarray(r.weights[:, i] >= level)


def _weight_above(r: TopKResult, *, i: int, level: float) -> np.ndarray:
    return np.asarray(r.weights[:, i] > level)


def _saturated(r: TopKResult, *, i: int) -> np.ndarray:
    return np.asarray(r.complement[:, i] <= 0.0)


def _candidate_points(method: str, x: FloatArray, k: int, tau: float) -> list[tuple[FloatArray, str]]:
    """Points where a kink or jump would sit: ties and p_i crossings at 1/2, 1 and 0."""
    n = x.shape[-1]
    order = np.argsort(-x, kind="stable")
    out: list[tuple[FloatArray, str]] = []
    if k < n:
        y = x.copy()
        y[order[k]] = y[order[k - 1]]
        out.append((y, "tie at the k-th value"))
    if n >= 3:
        y = x.copy()
        y[order[-1]] = y[order[-2]]
        out.append((y, "tie at the minimum"))
    entries = sorted({int(order[k - 1]), int(order[min(k, n - 1)]), int(order[0])})
    for i in entries:
        crossings: list[tuple[str, Callable[[TopKResult], np.ndarray]]] = [
            ("p_i = 1/2", functools.partial(_weight_at_least, i=i, level=0.5)),
            ("edge of p_i = 1", functools.partial(_saturated, i=i)),
            ("edge of p_i = 0", functools.partial(_weight_above, i=i, level=0.0)),
        ]
        for name, pred in crossings:
            y = _bisect_entry(method, x, k, tau, i, pred)
            if y is not None:
                out.append((y, f"{name} (entry {i})"))
    return out


def _line_points(x0: FloatArray, tau: float, d: FloatArray, ts: ArrayLike) -> FloatArray:
    """The rows ``x0 + t d tau`` for every ``t`` in ``ts``."""
    t = np.asarray(ts, dtype=np.float64)
    return np.asarray(x0[None, :] + t[:, None] * (d * tau)[None, :], dtype=np.float64)


def _accepted_edge(method: str, x0: FloatArray, k: int, tau: float, d: FloatArray, t0: float, side: int) -> float | None:
    """Distance from ``t0`` (refused) to the first accepted point on ``side`` (+1 or -1), or None.

    A geometric grid of distances (2^-30 .. 4, in units of tau) locates the edge of the refused
    stretch within a factor 2; a linear grid then pins it to 1/16 of that.
    """
    ts = t0 + side * _POLE_GRID
    ok = evaluate(_line_points(x0, tau, d, ts), k, method, tau=tau).status == "ok"
    if not ok.any():
        return None
    a = float(_POLE_GRID[int(np.argmax(ok))])
    fine = np.linspace(a / 2, a, 9)[1:]
    ok = evaluate(_line_points(x0, tau, d, t0 + side * fine), k, method, tau=tau).status == "ok"
    return float(fine[int(np.argmax(ok))])  # the last one (a) is accepted


def _pole_probe(method: str, x0: FloatArray, k: int, tau: float, d: FloatArray, t0: float) -> tuple[float, str] | None:
    """Evidence of a pole of ``t -> p(x0 + t d)`` in the refused stretch around ``t0``.

    From the refused ``t0`` the probe walks outwards on both sides until the method accepts
    (``[left, right]``, width ``w``), then reads p at distances ``0, w/2, 2w`` beyond each edge.
    A pole is reported when some ``p_i`` grows toward the stretch on *both* sides (a factor >=
    1.5 from each distance to the next nearer one: ``1/t`` gives 2 and 2.5), exceeds 2 in
    magnitude at both edges (beyond every weight of a top-k operator) and either changes sign
    across the stretch (a simple pole, ``A / (t - t*)``) or reaches ``1e3`` on both sides. A
    continuous p of bounded slope cannot do this across a stretch the method refuses; a refusal
    on a smooth stretch (bounded values that do not grow toward it) is no evidence at all.
    Returns ``(size, detail)``, size the smaller edge magnitude, or None.
    """
    u_minus = _accepted_edge(method, x0, k, tau, d, t0, -1)
    u_plus = _accepted_edge(method, x0, k, tau, d, t0, +1)
    if u_minus is None or u_plus is None:
        return None
    left, right = t0 - u_minus, t0 + u_plus
    w = right - left
    offsets = np.array([0.0, w / 2, 2 * w])
    ts = np.concatenate([left - offsets, right + offsets])
    r = evaluate(_line_points(x0, tau, d, ts), k, method, tau=tau)
    if (r.status != "ok").any():
        return None
    g = np.abs(r.weights.astype(np.float64))
    sides = (g[:3], g[3:])
    p_left, p_right = r.weights[0].astype(np.float64), r.weights[3].astype(np.float64)
    grows = np.ones(g.shape[-1], dtype=bool)
    for near, mid, far in sides:
        grows &= (near >= _POLE_GROWTH * mid) & (mid >= _POLE_GROWTH * far)
    edge = np.minimum(np.abs(p_left), np.abs(p_right))
    opposite = np.sign(p_left) * np.sign(p_right) < 0
    pole = grows & (edge > _POLE_EDGE) & (opposite | (edge >= _POLE_HUGE))
    if not pole.any():
        return None
    i = int(np.argmax(np.where(pole, edge, -np.inf)))
    detail = (
        f"p[{i}] = {p_left[i]:.4g} and {p_right[i]:.4g} at the edges of a stretch the method refuses "
        f"(t in [{left:.3g}, {right:.3g}]), growing like 1/t toward it from both sides "
        f"({g[2, i]:.3g} -> {g[1, i]:.3g} -> {g[0, i]:.3g} and {g[5, i]:.3g} -> {g[4, i]:.3g} -> {g[3, i]:.3g}): a pole"
    )
    return float(edge[i]), detail


def _line_class(
    method: str, x0: FloatArray, k: int, tau: float, d: FloatArray
) -> tuple[str, float, str] | None:
    """Smoothness class of ``t -> p(x0 + t d)`` at ``t = 0`` (d in units of tau), None if unmeasured.

    Three step sizes h, h/4, h/16: a jump in p (or in dp, d2p) at t = 0 keeps its size as h
    shrinks, while a smooth change shrinks with h, and a kink near (not at) 0 cannot persist
    across both refinements. A line on which the method refuses a point is no evidence of
    smoothness: it is unmeasured (None) unless the refusal is ``"inf"``/``"ill-conditioned"``
    and :func:`_pole_probe` finds a pole there (``discontinuous``).
    """
    hs = (_SMOOTH_STEP, _SMOOTH_STEP / 4, _SMOOTH_STEP / 16)
    ts = np.array([0.0] + [s * h for h in hs for s in (-2, -1, 1, 2)])
    batch = _line_points(x0, tau, d, ts)
    r = evaluate(batch, k, method, tau=tau)
    if r.failures:
        refused = np.isin(r.status, list(_POLE_CODES))
        if not refused.any():
            return None
        t0 = float(ts[np.flatnonzero(refused)[np.argmin(np.abs(ts[refused]))]])
        found = _pole_probe(method, x0, k, tau, d, t0)
        if found is None:
            return None
        return "discontinuous", found[0], found[1]
    g = r.weights.astype(np.float64)
    noise = 16 * np.finfo(float).eps * max(1.0, float(np.max(np.abs(g))))
    g0 = g[0]
    jumps: list[list[np.ndarray]] = [[], [], []]
    sides = []
    for b, h in enumerate(hs):
        gm2, gm1, gp1, gp2 = g[1 + 4 * b : 5 + 4 * b]
        d_plus = (-3 * g0 + 4 * gp1 - gp2) / (2 * h)
        d_minus = (3 * g0 - 4 * gm1 + gm2) / (2 * h)
        s_plus = (g0 - 2 * gp1 + gp2) / h**2
        s_minus = (g0 - 2 * gm1 + gm2) / h**2
        jumps[0].append(np.abs(gp1 - gm1))
        jumps[1].append(np.abs(d_plus - d_minus))
        jumps[2].append(np.abs(s_plus - s_minus))
        sides.append((d_plus, d_minus, s_plus, s_minus))
    h_small = hs[-1]
    dpb, dmb, spb, smb = sides[-1]
    tests = (
        ("discontinuous", jumps[0], noise, 1e-6),
        ("C0", jumps[1], noise / h_small, 1e-5),
        ("C1", jumps[2], noise / h_small**2, 1e-3),
    )
    for name, (big, mid, small), floor, absolute in tests:
        persists = (mid > 0.6 * big) & (small > 0.6 * mid) & (small > 100 * floor) & (small > absolute)
        if persists.any():
            c = small
            i = int(np.argmax(np.where(persists, c, -np.inf)))
            if name == "discontinuous":
                detail = f"p[{i}] jumps by {c[i]:.3g} across this point"
            elif name == "C0":
                detail = f"dp[{i}]/dt jumps from {dmb[i]:.4g} to {dpb[i]:.4g} across this point"
            else:
                detail = f"d2p[{i}]/dt2 jumps from {smb[i]:.4g} to {spb[i]:.4g} across this point"
            return name, float(c[i]), detail
    return "C-infinity", 0.0, ""


def _point_class(method: str, x0: FloatArray, k: int, tau: float) -> tuple[str, float, str]:
    """Worst class along two fixed-seed random lines through ``x0``."""
    if x0.shape[-1] < 2 or not np.isfinite(x0).all():
        return "C-infinity", 0.0, ""
    rng = np.random.default_rng(zlib.crc32(x0.tobytes() + repr((k, tau)).encode()))
    best = ("C-infinity", 0.0, "")
    for _ in range(2):
        d = rng.standard_normal(x0.shape[-1])
        d /= np.linalg.norm(d)
        measured = _line_class(method, x0, k, tau, d)
        if measured is None:
            continue
        cls, size, detail = measured
        if _CLASS_RANK[cls] > _CLASS_RANK[best[0]]:
            best = (cls, size, f"{detail}; direction {_vec(d, 3)}")
    return best


def _refused_for_pole(r: TopKResult) -> np.ndarray:
    """Rows the method refused with a code that a pole produces (``"inf"``, ``"ill-conditioned"``)."""
    return np.asarray(np.isin(r.status, list(_POLE_CODES)))


def _ray_candidates(method: str, x: FloatArray, k: int, tau: float) -> list[tuple[FloatArray, str]]:
    """Refused points on the ray ``max x + c (x - max x)`` (spread in z from 0.1 to 50).

    A pole (``weighted-softmax``, k >= 3) is a hypersurface that rays through a vector cross at
    some scale: the scan looks for a point refused with ``"inf"``/``"ill-conditioned"``, and
    for a sign change of some ``p_i`` with ``|p_i| > 1`` on both sides, which it bisects until
    it lands on a refused point. At most one point of each kind.
    """
    top = float(np.max(x))
    span = float(np.max(x) - np.min(x)) / tau
    if not span > 0:
        return []
    scales = np.geomspace(0.1, 50.0, _RAY_POINTS) / span

    def rows(c: FloatArray) -> FloatArray:
        return np.asarray(top + c[:, None] * (x - top)[None, :], dtype=np.float64)

    r = evaluate(rows(scales), k, method, tau=tau)
    out: list[tuple[FloatArray, str]] = []
    refused = _refused_for_pole(r)
    if refused.any():
        c = scales[int(np.argmax(refused))]
        out.append((rows(np.array([c]))[0], f"refused point on the ray (scale {c * span:.4g} in z)"))
    p = r.weights.astype(np.float64)
    flips = (np.sign(p[1:]) * np.sign(p[:-1]) < 0) & (np.abs(p[1:]) > 1) & (np.abs(p[:-1]) > 1)
    if not flips.any():
        return out
    j, i = (int(v) for v in np.argwhere(flips)[0])
    lo, hi = float(scales[j]), float(scales[j + 1])
    for _ in range(6):
        grid = np.linspace(lo, hi, 17)
        rr = evaluate(rows(grid), k, method, tau=tau)
        hit = _refused_for_pole(rr)
        if hit.any():
            c = float(grid[int(np.argmax(hit))])
            out.append((rows(np.array([c]))[0], f"sign change of p[{i}] on the ray (scale {c * span:.4g} in z)"))
            break
        s = np.sign(rr.weights[:, i].astype(np.float64))
        change = np.flatnonzero(s[1:] * s[:-1] < 0)
        if change.size == 0:
            break
        lo, hi = float(grid[change[0]]), float(grid[change[0] + 1])
    return out


def _smooth_measure(method: str, x: FloatArray, k: int, tau: float) -> tuple[str, float, str, FloatArray] | None:
    """Worst class over lines through ``x`` and its candidate points, None when nothing was measured.

    A base point the method refuses is measured only for a pole (lines through it go to
    :func:`_pole_probe`); other refusals leave it unmeasured.
    """
    if not np.isfinite(x).all() or x.shape[-1] < 2:
        return None
    r = _eval(method, x, k, tau)
    if r.failures and r.failures[0].code not in _POLE_CODES:
        return None
    rng = np.random.default_rng(zlib.crc32(x.tobytes() + repr((k, tau)).encode()))
    best: tuple[str, float, str, FloatArray] | None = None
    points = [(x, "the input")]
    if not r.failures:
        points += _candidate_points(method, x, k, tau)
    points += _ray_candidates(method, x, k, tau)
    for x0, where in points:
        for _ in range(2):
            d = rng.standard_normal(x.shape[-1])
            d /= np.linalg.norm(d)
            measured = _line_class(method, x0, k, tau, d)
            if measured is None:
                continue
            cls, size, detail = measured
            if best is None or _CLASS_RANK[cls] > _CLASS_RANK[best[0]] or (cls == best[0] and size > best[1]):
                best = (cls, size, f"{where}: {detail}; direction {_vec(d, 3)}", x0)
    return best


def _smooth_cases(cases: Sequence[Case]) -> list[Case]:
    """A bounded, deterministic subset of cases where kinks can be located (n <= 10)."""
    chosen: list[Case] = []
    seen: set[tuple[int, int]] = set()
    for c in cases:
        x = c.array
        n = x.shape[-1]
        if not (2 <= n <= 10) or not np.isfinite(x).all():
            continue
        z = _z(x, c.tau)
        if not 0.05 <= float(z.max() - z.min()) <= 50:
            continue
        key = (n, c.k)
        if key in seen and len(chosen) >= _MAX_SMOOTH_CASES // 2:
            continue
        seen.add(key)
        chosen.append(c)
        if len(chosen) >= _MAX_SMOOTH_CASES:
            break
    return chosen


def _refused_smooth_cases(method: str, cases: Sequence[Case], chosen: Sequence[Case]) -> list[Case]:
    """Up to :data:`_MAX_REFUSED_SMOOTH_CASES` cases (2 <= n <= 10) refused with a pole's code.

    The method refuses rows near a pole instead of returning huge inaccurate values, so the
    refused rows are where a pole is looked for (:func:`_pole_probe`).
    """
    small = [c for c in cases if 2 <= len(c.x) <= 10 and c not in chosen and np.isfinite(c.array).all()]
    _prefetch(method, [(c.array, c.k, c.tau) for c in small])
    out: list[Case] = []
    for c in small:
        r = _eval(method, c.array, c.k, c.tau)
        if r.failures and r.failures[0].code in _POLE_CODES and c not in out:
            out.append(c)
            if len(out) >= _MAX_REFUSED_SMOOTH_CASES:
                break
    return out


def check_smooth(method: str, cases: Sequence[Case]) -> PropertyResult:
    """Measure the smoothness class of ``method`` near candidate kinks of ``cases``.

    ``holds`` is True when the measured class is C1 or better. C-infinity means no
    discontinuity was detected in p or its first two derivatives. Lines on which the method
    refuses a point are not evidence of smoothness (they are skipped) unless the refusal hides
    a pole (:func:`_pole_probe`): a pole is ``discontinuous``. Besides the candidate kinks, the
    check looks for poles at refused suite cases and at refused points on rays through them.

    >>> check_smooth("hard", [Case((1.0, 0.5, 0.0), 1)]).smoothness
    'discontinuous'
    """
    spec = get_method(method)
    worst: tuple[str, float, str, FloatArray, Case] | None = None
    checked = skipped = 0
    chosen = _smooth_cases(cases)
    for case in [*chosen, *_refused_smooth_cases(method, cases, chosen)]:
        m = _smooth_measure(method, case.array, case.k, case.tau)
        if m is None:
            skipped += 1
            continue
        checked += 1
        if worst is None or _CLASS_RANK[m[0]] > _CLASS_RANK[worst[0]] or (m[0] == worst[0] and m[1] > worst[1]):
            worst = (*m, case)
    claimed = spec.guarantees.smoothness
    if worst is None:
        return PropertyResult(
            method, "smooth", spec.guarantees.smooth, None, None, None, checked, skipped,
            detail="no case with 2 <= n <= 10 and a moderate spread on which the method was measured",
            expected_smoothness=claimed,
        )
    cls, size, detail, x0, case = worst
    holds = cls in ("C-infinity", "C1")
    violations = 0 if holds else 1
    cex = None
    if not holds:
        k = case.k
        rank = _CLASS_RANK[cls]

        def violates(y: FloatArray, kk: int) -> bool:
            return _CLASS_RANK[_point_class(method, y, kk, case.tau)[0]] >= rank

        x0, k = _shrink(violates, x0, k, budget=60)
        cls2, _, detail2 = _point_class(method, x0, k, case.tau)
        if cls2 == cls:
            detail = detail2
        cex = Counterexample(method, tuple(float(v) for v in x0), k, case.tau, detail)
    return PropertyResult(
        method, "smooth", spec.guarantees.smooth, holds, size, cex, checked, skipped, violations,
        detail=detail if cls != "C-infinity" else "", smoothness=cls, expected_smoothness=claimed,
    )


# ---- generic driver and shrinking -------------------------------------------------------------


def _shrink(violates: Callable[[FloatArray, int], bool], x: FloatArray, k: int, budget: int = 300) -> tuple[FloatArray, int]:
    """Fewest entries, then simplest values, while ``violates`` stays true."""
    calls = 0

    def attempt(y: FloatArray, kk: int) -> bool:
        nonlocal calls
        if calls >= budget or not 1 <= kk <= np.isfinite(y).sum():
            return False
        calls += 1
        try:
            return violates(y, kk)
        except InvalidArgumentError:
            return False

    def drop_entries(x: FloatArray, k: int) -> tuple[FloatArray, int]:
        changed = True
        while changed and x.size > 1:
            changed = False
            for i in range(x.size):
                y = np.delete(x, i)
                for kk in dict.fromkeys((k, k - 1, min(k, y.size))):
                    if attempt(y, kk):
                        x, k, changed = y, kk, True
                        break
                if changed:
                    break
        return x, k

    x, k = drop_entries(x, k)
    finite = np.isfinite(x)
    if finite.any():
        ranks = np.unique(x[finite], return_inverse=True)[1].astype(np.float64)
        y = x.copy()
        y[finite] = ranks
        if not np.array_equal(y, x) and attempt(y, k):
            x = y
        else:
            top = float(np.max(x[finite]))
            for shift in (top, round(top)):
                y = np.where(finite, x - shift, x)
                if shift != 0 and attempt(y, k):
                    x = y
                    break
    for decimals in (0, 1, 2, 4):
        with np.errstate(invalid="ignore"):
            y = np.where(np.isfinite(x), np.round(x, decimals), x)
        if not np.array_equal(y, x) and attempt(y, k):
            x = y
            break
    for i in range(x.size):
        for decimals in (0, 1, 2):
            if not np.isfinite(x[i]):
                break
            y = x.copy()
            y[i] = np.round(y[i], decimals)
            if y[i] != x[i] and attempt(y, k):
                x = y
                break
    x, k = drop_entries(x, k)
    return x, k


_Items = Callable[[Case], list[tuple[FloatArray, int, float]]]


def _plain_items(case: Case) -> list[tuple[FloatArray, int, float]]:
    return [(case.array, case.k, case.tau)]


def _shift_items(case: Case) -> list[tuple[FloatArray, int, float]]:
    y, x_back, _ = _exact_shift(case.array)
    return [(x_back, case.k, case.tau), (y, case.k, case.tau)]


def _permutation_items(case: Case) -> list[tuple[FloatArray, int, float]]:
    x = case.array
    return [(x, case.k, case.tau)] + [(x[perm], case.k, case.tau) for perm in _permutations(x.shape[-1])]


def _hard_limit_items(case: Case) -> list[tuple[FloatArray, int, float]]:
    gap = _kth_gap(case.array, case.k)
    if gap is None:
        return []
    return [(_z(case.array, HARD_LIMIT_TAU_OVER_GAP * gap), case.k, 1.0)]


def _run_check(
    method: str,
    prop: str,
    cases: Sequence[Case],
    violation: _Violation,
    tol: float,
    *,
    failure_counts: bool = False,
    shrink: bool = True,
    items: _Items | None = _plain_items,
) -> PropertyResult:
    spec = get_method(method)
    expected = spec.guarantees.as_dict()[prop]
    if items is not None:
        _prefetch(method, [item for case in cases for item in items(case)])
    worst: float | None = None
    bad: tuple[float, Case, _Measure] | None = None
    checked = skipped = violations = 0
    for case in cases:
        m = violation(method, case.array, case.k, case.tau)
        if m is None:
            continue
        if m.failed and not failure_counts:
            skipped += 1
            continue
        checked += 1
        if math.isfinite(m.value) or m.value == math.inf:
            worst = m.value if worst is None else max(worst, m.value)
        if m.value > tol:
            violations += 1
            if bad is None or m.value > bad[0]:
                bad = (m.value, case, m)
    if checked == 0:
        return PropertyResult(method, prop, expected, None, None, None, 0, skipped, detail="not applicable to these inputs")
    if bad is None:
        return PropertyResult(method, prop, expected, True, worst, None, checked, skipped)
    _, case, m = bad
    x, k, tau = case.array, case.k, case.tau
    if shrink:
        floor = max(tol, 1e-2 * m.value) if math.isfinite(m.value) else tol  # keep it a clear failure

        def violates(y: FloatArray, kk: int) -> bool:
            mm = violation(method, y, kk, tau)
            return mm is not None and (failure_counts or not mm.failed) and mm.value > floor

        x, k = _shrink(violates, x, k)
        m = violation(method, x, k, tau) or m
    cex = Counterexample(method, tuple(float(v) for v in x), k, m.tau if m.tau is not None else tau, m.detail)
    return PropertyResult(method, prop, expected, False, worst, cex, checked, skipped, violations, detail=m.detail)


# ---- the public checks --------------------------------------------------------------------------


def check_range(method: str, cases: Sequence[Case]) -> PropertyResult:
    """Entries in [0, 1]: worst is ``max(-min p, max p - 1)`` (through ``1 - p`` computed accurately).

    >>> check_range("hard", [Case((3.0, 1.0, 2.0), 2)]).holds
    True
    """
    return _run_check(method, "range", cases, _v_range, TOL_ABS)


def check_sum(method: str, cases: Sequence[Case]) -> PropertyResult:
    """``sum p = k``: worst is ``|sum p - k| / k``.

    >>> check_sum("hard", [Case((3.0, 1.0, 2.0), 2)]).worst
    0.0
    """
    return _run_check(method, "sum", cases, _v_sum, TOL_ABS)


def check_monotone_weak(method: str, cases: Sequence[Case]) -> PropertyResult:
    """``x_i > x_j => p_i >= p_j``: worst is the largest ``p_j - p_i`` over such pairs.

    >>> check_monotone_weak("hard", [Case((3.0, 1.0, 2.0), 2)]).holds
    True
    """
    return _run_check(method, "monotone-weak", cases, _v_monotone_weak, TOL_ABS)


def check_monotone_strict(method: str, cases: Sequence[Case]) -> PropertyResult:
    """``x_i > x_j => p_i > p_j`` on ``k < n``; worst is the largest unseparated gap ``x_i - x_j``.

    >>> r = check_monotone_strict("hard", [Case((3.0, 1.0, 2.0), 1)])
    >>> r.holds, r.counterexample.x, r.counterexample.k
    (False, (2.0, 0.0, 1.0), 1)
    """
    return _run_check(method, "monotone-strict", cases, _v_monotone_strict, 0.0)


def check_shift_invariant(method: str, cases: Sequence[Case]) -> PropertyResult:
    """``ST(x + c) = ST(x)`` for a large exactly representable shift (tolerance 1e-12).

    >>> check_shift_invariant("hard", [Case((3.0, 1.0, 2.0), 2)]).holds
    True
    """
    return _run_check(method, "shift-invariant", cases, _v_shift, TOL_ABS, items=_shift_items)


def check_permutation_equivariant(method: str, cases: Sequence[Case]) -> PropertyResult:
    """``ST(x[perm]) = ST(x)[perm]`` for two permutations (tolerance 1e-12).

    >>> check_permutation_equivariant("hard", [Case((3.0, 1.0, 2.0, 2.0), 2)]).holds
    True
    """
    return _run_check(method, "permutation-equivariant", cases, _v_permutation, TOL_ABS, items=_permutation_items)


def check_hard_limit(method: str, cases: Sequence[Case]) -> PropertyResult:
    """Converges to ``T_k(x)`` as tau -> 0 where ``x_(k) > x_(k+1)`` (error <= 1e-6 at tau = 1e-3 g).

    The ``tau`` of each case is ignored: the check picks ``tau = 1e-3 * g``, ``g`` the smallest
    positive gap between distinct entries.
    A numerical failure of the method there counts as a violation.

    >>> check_hard_limit("hard", [Case((3.0, 1.0, 2.0), 2)]).holds
    True
    """
    return _run_check(
        method, "hard-limit", cases, _v_hard_limit, TOL_HARD_LIMIT, failure_counts=True, items=_hard_limit_items
    )


def check_softmax_at_k1(method: str, cases: Sequence[Case]) -> PropertyResult:
    """At ``k = 1`` the method equals softmax (tolerance 1e-12); not applicable without k = 1.

    >>> check_softmax_at_k1("hard", [Case((1.0, 0.0), 1)]).holds
    False
    """
    return _run_check(method, "softmax-at-k1", cases, _v_softmax_k1, TOL_ABS)


def _jacobian_cases(cases: Sequence[Case]) -> list[Case]:
    """At most :data:`_MAX_JACOBIAN_CASES` cases with n <= 10, spread evenly over ``cases``."""
    small = [c for c in cases if len(c.x) <= 10]
    if len(small) <= _MAX_JACOBIAN_CASES:
        return small
    step = len(small) / _MAX_JACOBIAN_CASES
    return [small[int(i * step)] for i in range(_MAX_JACOBIAN_CASES)]


def check_jacobian(method: str, cases: Sequence[Case]) -> PropertyResult:
    """Analytic Jacobian against central finite differences, ``max |J - J_fd| * tau <= 1e-6``.

    >>> check_jacobian("hard", [Case((3.0, 1.0, 2.0), 2)]).holds
    True
    """
    return _run_check(method, "jacobian", _jacobian_cases(cases), _v_jacobian, TOL_JACOBIAN, shrink=False)


def check_finite(method: str, cases: Sequence[Case]) -> PropertyResult:
    """Finite weights on every case; a reported numerical failure counts as not finite.

    >>> check_finite("hard", [Case((1e300, -1e300), 1)]).holds
    True
    """
    return _run_check(method, "finite", cases, _v_finite, 0.0, failure_counts=True)


CHECKS: dict[str, Callable[[str, Sequence[Case]], PropertyResult]] = {
    "range": check_range,
    "sum": check_sum,
    "monotone-weak": check_monotone_weak,
    "monotone-strict": check_monotone_strict,
    "shift-invariant": check_shift_invariant,
    "permutation-equivariant": check_permutation_equivariant,
    "hard-limit": check_hard_limit,
    "softmax-at-k1": check_softmax_at_k1,
    "smooth": check_smooth,
    "jacobian": check_jacobian,
    "finite": check_finite,
}


# ---- the default suite and the driver ------------------------------------------------------------


def _suite_ks(n: int, k: int | None) -> list[int]:
    if k is not None:
        return [k] if k <= n else []
    return sorted({kk for kk in (1, 2, max(1, n // 3), n - 1, n) if 1 <= kk <= n})


def default_suite(*, trials: int = 3, seed: int = 0, k: int | None = None) -> tuple[Case, ...]:
    """The deterministic adversarial suite of ``verify-properties``.

    Per trial and size n in :data:`SUITE_SIZES`: a random vector at each spread of
    :data:`SUITE_SPREADS` (rotating offsets 0 and 1e6), a vector with ties, one with near-ties
    (relative gaps 1e-9), small integers with a tie at the k-th value; each at k = 1, 2, n/3,
    n-1, n (or the given k), tau = 1. Same ``seed`` and ``trials``, same cases.

    Raises:
        InvalidArgumentError: ``trials < 1`` or ``k < 1``.

    >>> len(default_suite(trials=1)) > 100
    True
    """
    if trials < 1:
        raise InvalidArgumentError(f"trials must be >= 1, got {trials}")
    if k is not None and k < 1:
        raise InvalidArgumentError(f"k must be >= 1, got {k}")
    rng = np.random.default_rng(seed)
    cases: list[Case] = []
    for t in range(trials):
        for n in SUITE_SIZES:
            vectors: list[tuple[FloatArray, str]] = []
            for s, spread in enumerate(SUITE_SPREADS):
                offset = SUITE_OFFSETS[(s + t) % len(SUITE_OFFSETS)]
                vectors.append((offset + spread * rng.standard_normal(n), f"spread {spread:g}, offset {offset:g}"))
            if n >= 2:
                base = rng.standard_normal(max(1, (n + 1) // 2))
                vectors.append((rng.permutation(np.resize(base, n)), "ties"))
                near = rng.standard_normal(n)
                near[1:] = near[0] * (1 + 1e-9 * np.arange(1, n)) + 1e-9 * np.arange(1, n)
                vectors.append((rng.permutation(near), "near-ties"))
                vectors.append((rng.integers(0, 3, n).astype(np.float64), "small integers"))
            for x, label in vectors:
                for kk in _suite_ks(n, k):
                    cases.append(Case(tuple(float(v) for v in x), kk, 1.0, f"n={n} {label}"))
    return tuple(cases)


def cases_from_vectors(vectors: ArrayLike, k: int | None = None, *, tau: float = 1.0) -> tuple[Case, ...]:
    """Cases from user vectors (rows of a 2-D array): the given k, or k = 1, 2, n/3, n-1, n.

    Raises:
        InvalidArgumentError: not a 1-D/2-D array of reals, or k larger than every row.

    >>> [c.k for c in cases_from_vectors([[3.0, 1.0, 2.0]])]
    [1, 2, 3]
    """
    arr = np.asarray(vectors, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[-1] == 0:
        raise InvalidArgumentError(f"vectors must be a 1-D or 2-D array with entries, got shape {arr.shape}")
    cases = []
    for row_index, row in enumerate(arr):
        n = int(np.isfinite(row).sum())
        for kk in _suite_ks(n, k):
            cases.append(Case(tuple(float(v) for v in row), kk, tau, f"row {row_index}"))
    if not cases:
        raise InvalidArgumentError(f"k must satisfy 1 <= k <= n (n={arr.shape[-1]}), got {k}")
    return tuple(cases)


def verify_properties(
    methods: Sequence[str] | None = None,
    vectors: ArrayLike | None = None,
    k: int | None = None,
    *,
    tau: float = 1.0,
    trials: int = 3,
    seed: int = 0,
    properties: Sequence[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> VerifyReport:
    """Measure every property of every method on ``vectors`` or the default suite.

    Args:
        methods: registered names (default: all).
        vectors: user vectors, 1-D or 2-D (rows); None for :func:`default_suite`.
        k: fixed k, or None to vary k (1, 2, n/3, n-1, n).
        tau: temperature of the user vectors (the suite uses 1; ``hard-limit`` picks its own).
        trials, seed: size and seed of the default suite.
        properties: a subset of :data:`PROPERTIES` (default: all).
        progress: called with ``(done, total)`` after each (method, property).

    Raises:
        InvalidArgumentError: unknown method or property, bad k, trials or vectors.

    >>> report = verify_properties(["hard"], [[3.0, 1.0, 2.0]], 1, properties=["range", "smooth"])
    >>> [(r.property, r.holds) for r in report.results]
    [('range', True), ('smooth', False)]
    """
    names = tuple(methods) if methods is not None else tuple(METHODS)
    for name in names:
        get_method(name)
    props = tuple(properties) if properties is not None else PROPERTIES
    for prop in props:
        if prop not in CHECKS:
            raise InvalidArgumentError(f"unknown property {prop!r}; valid properties: {', '.join(PROPERTIES)}")
    if vectors is None:
        cases = default_suite(trials=trials, seed=seed, k=k)
        source = "suite"
    else:
        cases = cases_from_vectors(vectors, k, tau=tau)
        source = "input"
    results = []
    total = len(names) * len(props)
    for a, name in enumerate(names):
        for b, prop in enumerate(props):
            results.append(CHECKS[prop](name, cases))
            if progress is not None:
                progress(a * len(props) + b + 1, total)
    _CACHE.clear()
    return VerifyReport(
        methods=names, properties=props, cases=len(cases), results=tuple(results), source=source,
        seed=seed if vectors is None else None, trials=trials if vectors is None else None,
    )
