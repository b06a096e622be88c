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

With a real k (the methods that take one, :func:`takes_real_k`; the others have no case at a
non-integer k, which is not a failure of theirs) every property above keeps its definition with
``T_k`` the real-k hard top-k: 1 on the entries above the ``ceil(k)``-th largest value, the
entries equal to it sharing ``k - #above`` (``hard-limit`` then needs the ``ceil(k)``-th value
apart from both neighbours). Two more properties are measured for those methods
(:data:`K_PROPERTIES`, :mod:`topk_cli.properties.in_k`): ``monotone-k`` (each ``p_i``
non-decreasing in k) and ``continuous-k`` (no jump in k).
"""

from topk_cli.properties.checks import (
    CHECKS,
    check_finite,
    check_hard_limit,
    check_jacobian,
    check_monotone_strict,
    check_monotone_weak,
    check_permutation_equivariant,
    check_range,
    check_shift_invariant,
    check_softmax_at_k1,
    check_sum,
)
from topk_cli.properties.evaluator import Evaluator
from topk_cli.properties.in_k import (
    check_continuous_k,
    check_monotone_k,
    expected_in_k,
    k_applies,
    takes_real_k,
)
from topk_cli.properties.results import (
    HARD_LIMIT_TAU_OVER_GAP,
    K_PROPERTIES,
    PROPERTIES,
    SUITE_OFFSETS,
    SUITE_SIZES,
    SUITE_SPREADS,
    TOL_ABS,
    TOL_HARD_LIMIT,
    TOL_JACOBIAN,
    UNDERFLOW_SPAN,
    Case,
    Counterexample,
    PropertyResult,
    VerifyReport,
)
from topk_cli.properties.smoothness import _line_class, _pole_probe, check_smooth
from topk_cli.properties.verify import cases_from_vectors, default_suite, verify_properties

__all__ = [
    "CHECKS",
    "HARD_LIMIT_TAU_OVER_GAP",
    "K_PROPERTIES",
    "PROPERTIES",
    "SUITE_OFFSETS",
    "SUITE_SIZES",
    "SUITE_SPREADS",
    "TOL_ABS",
    "TOL_HARD_LIMIT",
    "TOL_JACOBIAN",
    "UNDERFLOW_SPAN",
    "Case",
    "Counterexample",
    "Evaluator",
    "PropertyResult",
    "VerifyReport",
    "_line_class",
    "_pole_probe",
    "cases_from_vectors",
    "check_continuous_k",
    "check_finite",
    "check_hard_limit",
    "check_jacobian",
    "check_monotone_k",
    "check_monotone_strict",
    "check_monotone_weak",
    "check_permutation_equivariant",
    "check_range",
    "check_shift_invariant",
    "check_smooth",
    "check_softmax_at_k1",
    "check_sum",
    "default_suite",
    "expected_in_k",
    "k_applies",
    "takes_real_k",
    "verify_properties",
]
