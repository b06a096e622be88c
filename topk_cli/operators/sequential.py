"""The sequential operators ``iterative`` and ``weighted-softmax``, computed faithfully.

Both build ``p`` in ``k`` rounds, each adding one softmax-like distribution, on a ``(B, n)``
batch ``z`` (last axis; see ``_base`` for the contract). With ``q = 1 - p``:

* ``iterative`` (Su 2019): ``d = z - min z``; ``k`` times ``p <- p + softmax(q * d)``;
* ``weighted-softmax``: ``k`` times ``p <- p + q e^z / sum_j q_j e^{z_j}``.

Neither keeps ``0 <= p <= 1``: ``q`` goes negative (``weighted-softmax``, ``k = 2``, ``tau -> 0``
tends to 1.5 on the max and 0.5 on the second entry; ``iterative`` at ``k = n`` on ``(1, 0)``
gives ``p_1 = 1.298``). The point of this module is to report that true mathematics rather than
float64 artefacts: computed naively, ``1 - p`` rounds to 0 once ``p`` is within 1e-16 of 1,
which changes the answer (and hides the wrong limit). So ``q`` is carried *relatively*
accurately through the rounds:

* ``weighted-softmax`` works in signed log space, ``(sign, log|.|)``, for ``q``, ``p`` and
  ``u = q e^z``. The update ``q_i <- q_i (S - e^{z_i}) / S`` uses
  ``S - e^{z_i} = sum_{j != i} u_j - p_i e^{z_i}``, whose positive and negative parts are
  exclusive log-sums (no subtraction of ``e^{z_i}`` from a sum that contains it), so ``q_1``
  after round one is ``e^{z_2 - z_1}``-small and exact to rounding even when that underflows
  in linear space. ``S`` may be negative (``k >= 3`` at small ``tau``): that is the operator.
  ``S = 0`` is a pole: the row is reported with code ``"inf"``.
* ``iterative`` works in linear space (``q * d`` only needs ``q`` relatively accurate, and
  that survives underflow of ``q``): ``c = 1 - s`` comes from an exclusive log-sum, and the new
  ``q`` is ``q - s`` or ``c - p``, whichever has the smaller rounding bound.

Ill-conditioned rows. Both operators have inputs where no float64 algorithm is accurate:
``weighted-softmax`` has poles (``S = sum_j (1 - p_j) e^{z_j}`` crosses 0 for ``k >= 3``) and
zeros of ``1 - p_i`` where ``S - e^{z_i}`` cancels, and the rounds of both can amplify errors
(``iterative``: ``d s_i / d(1 - p_i) = s_i (1 - s_i)(z_i - min z)`` reaches hundreds at large
spreads). Each forward pass therefore carries, for every row, a running estimate of the absolute
error of ``p``: the rounding errors of the rounds, propagated to first order through the same
linearisation as the Jacobian (relative errors of ``q``, absolute errors of ``p``), with a random
local error at every operation of the size of its rounding bound (``u`` times the magnitude of
each log-space value, unless what was added is smaller; ``u (P + N) / |P - N|`` for a signed sum
of positive part ``P`` and negative part ``N``). Three such random patterns run side by side
(``O(n)`` work and ``O(B n)`` memory per round); the estimate is 3 times the largest RMS over
them, after averaging over exact ties as the public API does. It is an estimate, not a proof:
against mpmath on ~6500 random rows (spreads 0.1 to 1e4, n 10 and 100, k 2 to 50) it was 0.8 to
~300 times the real error where that exceeded 1e-12 (median 8), and no row over the tolerance
went unflagged; rare rows are over-estimated ~1e3-fold. Rows whose estimate exceeds :data:`ILL_CONDITIONED_TOLERANCE` get code
``"ill-conditioned"`` (NaN weights from the public API; ``level`` is the round where the estimate
crossed it, ``value`` the estimate, and the message says which round amplified the errors most
and why).

Fast paths (both methods). The rounds are first run in plain float64 with a rigorous forward
error bound (:func:`~topk_cli.operators._iterative_fast._it_fast`,
:func:`~topk_cli.operators._weighted_softmax_fast.ws_fast`, which carries ``1 - p`` as a product);
only rows it proves accurate to well within the tolerance (``p`` to 1e-12 absolute, every
``1 - p_i`` to 1e-10 relative) are returned from it, the others are recomputed faithfully as above,
row by row.

Derivatives (with respect to ``z``; the public API divides by ``tau``): the Jacobian is forward
mode through the ``k`` rounds, ``O(k n^2)`` per row; the VJP is reverse mode, ``O(k n)`` time
per row; ``weighted-softmax`` stores the ``k`` rounds, ``O(B k n)`` memory (kept in
``Forward.aux``), ``iterative`` keeps none and recomputes them for its derivatives. Both use
the accurate complements and exclusive sums, so saturated entries keep their (tiny) relative
accuracy. For ``weighted-softmax`` they use ``e^{z_i} / S``, which overflows once a gap in
``z`` exceeds ~709 (e.g. ``tau`` below 1/709 of the spread) while the quantities it multiplies
underflow: those rows are recomputed with every factor in signed log space (``O(k n^2)`` per
row, also for the VJP), which returns the (typically exponentially small) derivative. The logs
there are as large as the gaps, and their rounding errors ``u |gap|`` grow with them: where the
bound ``16 k u max |log|`` exceeds :data:`ILL_CONDITIONED_TOLERANCE` (gaps beyond ~3e5) the row
is reported as a :class:`~topk_cli.errors.NumericalFailureError` (code ``"ill-conditioned"``),
never returned as inf, NaN or noise. For ``iterative`` the derivative w.r.t. ``min z`` is taken
through the first minimal entry (one-sided when the minimum is tied).
"""

from __future__ import annotations

from topk_cli.operators._logsigned import ILL_CONDITIONED_TOLERANCE
from topk_cli.operators.iterative import ITERATIVE, iterative_topk
from topk_cli.operators.weighted_softmax import (
    WEIGHTED_SOFTMAX,
    _ws_jacobian_linear,
    _ws_jacobian_log,
    weighted_softmax_topk,
)

__all__ = [
    "ILL_CONDITIONED_TOLERANCE",
    "ITERATIVE",
    "WEIGHTED_SOFTMAX",
    "_ws_jacobian_linear",
    "_ws_jacobian_log",
    "iterative_topk",
    "weighted_softmax_topk",
]
