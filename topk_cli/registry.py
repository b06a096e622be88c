"""The registry of methods: the one place that knows each method, exposed as ``METHODS``.

Each :class:`MethodSpec` carries everything the rest of the package asks about a method: what
it is (summary, family, reference, aliases under which other papers and libraries know it),
its numerical implementation (required), what it *claims* (:class:`Guarantees`), what it can
do (:class:`Capabilities`: exact or Monte Carlo, Jacobian, integer k, default in the probe,
potential), its extra parameters (:class:`ParamSpec`), the reference ``stability-probe`` judges
it against (:class:`ProbeReference`), the failure codes it may report (:class:`FailureCode`),
and, for a method whose breakdown can be predicted, its model (:class:`StabilityModel`).
Commands, analyses, renderers and test grids derive from these fields; none tests a method's
name. The record types are defined in :mod:`topk_cli.method_spec`.

The claims are not copied from the source articles: each was measured by ``softtopk
verify-properties`` and is tested against the same checks (``tests/test_properties.py``), so a
claim here is a claim the tool will defend. Where an article asserts more, the README says so.

Adding a method: write its operator module (an :class:`Implementation`), add one
``MethodSpec`` to ``_SPECS`` below, and its tests.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection, Iterable, Mapping
from types import MappingProxyType
from typing import Any, cast

from topk_cli.catalog import METHOD_NAMES, METHOD_PARAMETERS
from topk_cli.catalog import ParamSpec as ParamSpec  # re-exported: callers look the record types up here
from topk_cli.errors import InvalidArgumentError, UnknownMethodError
from topk_cli.method_spec import (
    MONTE_CARLO_STDERRS as MONTE_CARLO_STDERRS,  # re-exported: the registry is where callers look it up
)
from topk_cli.method_spec import (
    SMOOTHNESS_CLASSES,
    Alias,
    Capabilities,
    Evaluation,
    FailureCode,
    Guarantees,
    MethodSpec,
    ProbeReference,
    StabilityModel,
)
from topk_cli.operators import gumbel_topk as _gumbel
from topk_cli.operators.baselines import K_SOFTMAX, STRAIGHT_THROUGH, k_softmax_reference
from topk_cli.operators.coordinate_descent import (
    COORDINATE_DESCENT,
    DEFAULT_ITERATIONS,
    coordinate_descent_reference,
)
from topk_cli.operators.dftopk import DFTOPK, dftopk_reference
from topk_cli.operators.grad_recursive import GRAD_RECURSIVE, grad_recursive_trace
from topk_cli.operators.gradtopk import GRAD
from topk_cli.operators.hard import HARD
from topk_cli.operators.perturbed import DEFAULT_SAMPLES, DEFAULT_SEED, PERTURBED, perturbed_potential
from topk_cli.operators.potentials import (
    binary_entropy,
    clip_regulariser,
    cube_regulariser,
    entropy,
    laplace_regulariser,
    log_esp,
    no_regulariser,
    regularised_max,
)
from topk_cli.operators.projection import THRE_CLIP, THRE_CUBE, f_clip, f_cube
from topk_cli.operators.scaled_sigmoid import SCALED_SIGMOID, scaled_sigmoid_reference
from topk_cli.operators.sequential import ITERATIVE, WEIGHTED_SOFTMAX
from topk_cli.operators.sinkhorn import DEFAULT_MAX_ITER, DEFAULT_TOL, NO_CONVERGENCE, OT_SINKHORN
from topk_cli.operators.sorting import (
    MAX_ROW_ENTRIES,
    NEURALSORT,
    SOFTSORT,
    SORTING_NETWORK,
    neuralsort_reference,
    softsort_reference,
    sorting_network_reference,
)
from topk_cli.operators.threshold import THRE_EXP, THRE_LAPLACE
from topk_cli.operators.threshold_sigmoid import THRE_SIGMOID
from topk_cli.operators.topk_softmax import TOPK_SOFTMAX, topk_softmax_reference
from topk_cli.recursion import recursion_outlook
from topk_cli.references import (
    extended_precision,
    f_exp,
    f_laplace,
    f_sigmoid,
    grad_reference,
    iterative_definition,
    threshold_bisection,
    weighted_softmax_definition,
)

# ---------------------------------------------------------------------------------------------
# the entries

_THRESHOLD_REFERENCE = (
    "bisection of sum f(z - lambda) = k in float64, until the computed total is exactly k or lambda is "
    "bracketed by two adjacent floats (independent of the {solver}), "
    "where |lambda| < ~1e4"
)
_SEQUENTIAL_REFERENCE = "the definition run in extended precision (np.longdouble), on trials where it keeps 1 - p above 1e-6"
_RANK_TIES = (
    "Exact derivatives away from ties. At a tie the derivatives are those of the branch where the tied entries "
    "are ordered by position: exact along directions that keep them tied (d/dtau), one-sided per column for a "
    "tied pair, but for the middle entries of a tie of three or more neither one-sided derivative (no choice "
    "of sides can also keep d/dtau exact): verify-properties' jacobian check measures 'no' there "
    "(x = 2,1,1,1,0, k = 5)."
)
_SEQUENTIAL_FAILURES = (
    FailureCode("ill-conditioned", "the propagated rounding error of p exceeds 1e-9: the operator is ill-conditioned at this input"),
    FailureCode("inf", "a normaliser vanished (a pole of the operator): the weights are unbounded"),
)

_SPECS: tuple[MethodSpec, ...] = (
    MethodSpec(
        name="hard",
        summary="Hard top-k T_k(x): 1 on the k largest entries, ties at the k-th value share the rest.",
        family="baseline",
        guarantees=Guarantees(
            monotone_k=True, continuous_k=True,
            range=True, sum=True, monotone_weak=True, monotone_strict=False,
            shift_invariant=True, permutation_equivariant=True, hard_limit=True,
            softmax_at_k1=False, jacobian=True, finite=True, smoothness="discontinuous",
            sparse=True,
        ),
        reference="The k-hot indicator; the target every smooth operator approximates.",
        notes="Piecewise constant: its Jacobian is 0 wherever it exists.",
        implementation=HARD,
        capabilities=Capabilities(integer_k=False, probe_default=False, potential=regularised_max(no_regulariser)),
        probe=ProbeReference("none: hard top-k is exact by construction (a partition and a comparison)"),
    ),
    MethodSpec(
        name="iterative",
        summary="Su (2019) soft-k-max: k rounds of p += softmax((1 - p) * (z - min z)).",
        family="iterative",
        guarantees=Guarantees(
            range=False, sum=True, monotone_weak=False, monotone_strict=False,
            shift_invariant=True, permutation_equivariant=True, hard_limit=False,
            softmax_at_k1=True, jacobian=True, finite=False, smoothness="C0",
        ),
        reference="J. Su, 'Softmax sequel: finding smooth approximations of Top-K', kexue.fm (2024), after his 2019 post.",
        notes=(
            "Entries can exceed 1 (e.g. k = n); not scale-equivariant because of the (1 - p) * z product. "
            "C0 for k >= 2: z - min z makes dp jump where the two smallest entries cross. "
            "Tends to hard top-k as tau -> 0 for distinct values, not with ties inside the top k "
            "(x = 2,1,2,0, k = 2: limit 0.833, 0.333, 0.833, 0). "
            "Cost O(n k) per row (k sequential rounds): n*k above 2.5e7 per row is refused."
        ),
        implementation=ITERATIVE,
        probe=ProbeReference(_SEQUENTIAL_REFERENCE, extended_precision(iterative_definition)),
        failures=_SEQUENTIAL_FAILURES,
    ),
    MethodSpec(
        name="weighted-softmax",
        summary="k rounds of p += softmax(z; weights 1 - p) (StackExchange proposal); wrong tau -> 0 limit.",
        family="iterative",
        guarantees=Guarantees(
            range=False, sum=True, monotone_weak=False, monotone_strict=False,
            shift_invariant=True, permutation_equivariant=False, hard_limit=False,
            softmax_at_k1=True, jacobian=True, finite=False, smoothness="discontinuous",
        ),
        reference="'Is there something like softmax but for top k values?', Cross Validated answer; analysed in Su (2024).",
        notes=(
            "For k = 2 and tau -> 0 it tends to 1.5 on the max and 0.5 on the second entry. "
            "For k >= 3 the weights 1 - p turn negative and sum(w e^z) crosses 0: poles "
            "(x = 0,-9.63,-0.03, k = 3 gives p = 131, -1.1, -127), so it is discontinuous and, near "
            "a pole, rounding differences between equivalent orderings grow without bound. "
            "Cost O(n k) per row (k sequential rounds): n*k above 1e7 per row is refused."
        ),
        implementation=WEIGHTED_SOFTMAX,
        probe=ProbeReference(_SEQUENTIAL_REFERENCE, extended_precision(weighted_softmax_definition)),
        failures=_SEQUENTIAL_FAILURES,
    ),
    MethodSpec(
        name="grad",
        summary="GradTopK: p = grad_z log e_k(exp z), exact via a log-space dynamic program.",
        family="gradient",
        guarantees=Guarantees(
            range=True, sum=True, monotone_weak=True, monotone_strict=True,
            shift_invariant=True, permutation_equivariant=True, hard_limit=True,
            softmax_at_k1=True, jacobian=True, finite=True, smoothness="C-infinity",
        ),
        reference="Su (2024) GradTopK; = inclusion probabilities of conditional Poisson sampling (Hajek 1964; Chen, Dempster & Liu 1994) = SIMPLE marginals (Ahmed et al. 2023).",
        implementation=GRAD,
        capabilities=Capabilities(potential=log_esp),
        probe=ProbeReference(
            "an independent forward/backward program in linear space, extended precision (catches "
            "implementation bugs, not a flaw shared by both)",
            grad_reference,
        ),
        aliases=(
            Alias("simple", "SIMPLE's exact k-subset marginals (Ahmed, Zeng, Niepert & Van den Broeck, ICLR 2023, 'SIMPLE: a gradient estimator for k-subset sampling')"),
        ),
    ),
    MethodSpec(
        name="grad-recursive",
        summary=(
            "GradTopK by the article's recursion; breaks (log of <= 0) long before saturation: "
            "each level multiplies the rounding error by the odds p/(1-p)."
        ),
        family="gradient",
        guarantees=Guarantees(
            range=True, sum=True, monotone_weak=True, monotone_strict=True,
            shift_invariant=True, permutation_equivariant=True, hard_limit=False,
            softmax_at_k1=True, jacobian=True, finite=False, smoothness="C-infinity",
        ),
        reference="Su (2024), 'Softmax sequel', reference implementation of GradTopK.",
        notes="Kept to expose its failure: rows it cannot compute are reported, never returned wrong.",
        implementation=GRAD_RECURSIVE,
        capabilities=Capabilities(potential=log_esp),
        probe=ProbeReference(
            "GradTopK exactly, by grad's reference (an independent forward/backward program in linear space, "
            "extended precision)",
            grad_reference,
        ),
        failures=(
            FailureCode("log0", "a log argument 1 - p_i of the recursion rounded to exactly 0 (log 0 = -inf)"),
            FailureCode("log-negative", "a log argument 1 - p_i of the recursion rounded below 0 (its log is NaN)"),
            FailureCode("cancellation", "the recursion's subtractions lost digits that compounded over the levels: the weights differ from the exact ones by more than 4e-13"),
        ),
        stability=StabilityModel(
            "the error-amplification model of the recursion (digits lost grow by the odds p/(1-p) per level)",
            grad_recursive_trace,
            recursion_outlook,
        ),
        stable_equivalent="grad",
    ),
    MethodSpec(
        name="thre-exp",
        summary="Threshold top-k with f = min(1, exp): entropy-regularised LP over the capped simplex.",
        family="threshold",
        guarantees=Guarantees(
            monotone_k=True, continuous_k=True,
            range=True, sum=True, monotone_weak=True, monotone_strict=False,
            shift_invariant=True, permutation_equivariant=True, hard_limit=True,
            softmax_at_k1=True, jacobian=True, finite=True, smoothness="C0",
        ),
        reference="Su (2024) ThreTopK with min(1, e^x); entropic regularisation over D(n,k).",
        notes="Kink where z_i = lambda; the Jacobian takes the saturated side (p_i = 1) there.",
        implementation=THRE_EXP,
        capabilities=Capabilities(integer_k=False, potential=regularised_max(entropy)),
        probe=ProbeReference(_THRESHOLD_REFERENCE.format(solver="closed form"), threshold_bisection(f_exp)),
    ),
    MethodSpec(
        name="thre-sigmoid",
        summary="Threshold top-k with f = sigmoid, lambda solved to full float64 precision.",
        family="threshold",
        guarantees=Guarantees(
            monotone_k=True, continuous_k=True,
            range=True, sum=True, monotone_weak=True, monotone_strict=True,
            shift_invariant=True, permutation_equivariant=True, hard_limit=True,
            softmax_at_k1=False, jacobian=True, finite=True, smoothness="C-infinity",
        ),
        reference="Su (2024) ThreTopK with sigmoid; = LML (Amos et al. 2019); limit of entropic-OT SOFT top-k (Xie et al. 2020).",
        implementation=THRE_SIGMOID,
        capabilities=Capabilities(integer_k=False, potential=regularised_max(binary_entropy)),
        probe=ProbeReference(_THRESHOLD_REFERENCE.format(solver="Newton solver"), threshold_bisection(f_sigmoid)),
        aliases=(
            Alias("lml", "the Limited Multi-Label projection (Amos, Koltun & Kolter 2019, 'The Limited Multi-Label Projection Layer')"),
        ),
    ),
    MethodSpec(
        name="thre-laplace",
        summary="Threshold top-k with f = Laplace CDF: closed form after a sort, C1.",
        family="threshold",
        guarantees=Guarantees(
            monotone_k=True, continuous_k=True,
            range=True, sum=True, monotone_weak=True, monotone_strict=True,
            shift_invariant=True, permutation_equivariant=True, hard_limit=True,
            softmax_at_k1=False, jacobian=True, finite=True, smoothness="C1",
        ),
        reference="Su (2024) ThreTopK with the Laplace CDF; = LapSum top-k (ICML 2025).",
        notes="Equals softmax at k = 1 only while every softmax weight is below 1/2 (the article claims it always does).",
        implementation=THRE_LAPLACE,
        capabilities=Capabilities(integer_k=False, potential=regularised_max(laplace_regulariser)),
        probe=ProbeReference(_THRESHOLD_REFERENCE.format(solver="closed form"), threshold_bisection(f_laplace)),
        aliases=(
            Alias("lapsum", "LapSum top-k (Struski, Bednarczyk, Podolak & Tabor, ICML 2025, 'LapSum - one method to differentiate them all: ranking, sorting and top-k selection')"),
        ),
    ),
    MethodSpec(
        name="thre-clip",
        summary="Threshold top-k with f = clip(t, 0, 1): the Euclidean projection onto the capped simplex (exact, sparse).",
        family="threshold",
        guarantees=Guarantees(
            monotone_k=True, continuous_k=True,
            range=True, sum=True, monotone_weak=True, monotone_strict=False,
            shift_invariant=True, permutation_equivariant=True, hard_limit=True,
            softmax_at_k1=False, jacobian=True, finite=True, smoothness="C0",
            sparse=True,
        ),
        reference=(
            "argmax <p, z> - ||p||^2 / 2 over the capped simplex: sparsemax at k = 1 (Martins & Astudillo 2016); "
            "Sander et al. (2023) top-k mask with p = 2; entmax's budget_bisect."
        ),
        notes=(
            "Exactly sparse; piecewise linear (C0). At a kink (an entry exactly at p = 0 or p = 1) the "
            "Jacobian takes the clipped side: the entry counts as clipped (derivative 0), as for thre-exp."
        ),
        implementation=THRE_CLIP,
        capabilities=Capabilities(integer_k=False, potential=regularised_max(clip_regulariser)),
        probe=ProbeReference(_THRESHOLD_REFERENCE.format(solver="sorted-breakpoint closed form"), threshold_bisection(f_clip)),
        aliases=(
            Alias("sparse-topk", "Sander, Puigcerver, Djolonga, Peyre & Blondel, ICML 2023, 'Fast, differentiable and sparse top-k: a convex analysis perspective' (p = 2)"),
            Alias("entmax-budget", "budget_bisect of the entmax package (deep-spin/entmax): max <x, p> - ||p||^2 / 2 s.t. 0 <= p <= 1, sum p = budget"),
        ),
    ),
    MethodSpec(
        name="thre-cube",
        summary="Threshold top-k with f = clip(t, 0, 1)^3: Sander et al.'s p = 4/3 sparse top-k mask.",
        family="threshold",
        guarantees=Guarantees(
            monotone_k=True, continuous_k=True,
            range=True, sum=True, monotone_weak=True, monotone_strict=False,
            shift_invariant=True, permutation_equivariant=True, hard_limit=True,
            softmax_at_k1=False, jacobian=True, finite=True, smoothness="C0",
            sparse=True,
        ),
        reference=(
            "argmax <p, z> - (3/4) sum p^(4/3) over the capped simplex: Sander et al. (2023), p-norm "
            "regularisation with p = 4/3 (their default)."
        ),
        notes=(
            "Exactly sparse and C1 where entries leave 0, but the cap at 1 is a kink (slope 3 below, 0 above): "
            "C0 once an entry saturates while others are free, so not 'differentiable everywhere'. "
            "Kinks take the clipped side, as for thre-clip. Regulariser (3/4) sum p^(4/3) = (1/q) sum p^q; "
            "written as sum p^q it is the same map at tau * 4/3."
        ),
        implementation=THRE_CUBE,
        capabilities=Capabilities(integer_k=False, potential=regularised_max(cube_regulariser)),
        probe=ProbeReference(_THRESHOLD_REFERENCE.format(solver="interval search and Newton"), threshold_bisection(f_cube)),
    ),
    MethodSpec(
        name="ot-sinkhorn",
        summary="Entropic-OT SOFT top-k (Xie et al. 2020) by log-domain Sinkhorn; rows that do not converge are reported.",
        family="optimal-transport",
        guarantees=Guarantees(
            monotone_k=True, continuous_k=True,
            range=False, sum=True, monotone_weak=True, monotone_strict=True,
            shift_invariant=True, permutation_equivariant=True, hard_limit=False,
            softmax_at_k1=False, jacobian=True, finite=False, smoothness="C-infinity",
        ),
        reference=(
            "Xie et al., NeurIPS 2020, 'Differentiable top-k with optimal transport': "
            "two anchors {0, 1}, masses (n-k)/n and k/n, squared cost, eps = 1 on (z - y)^2 / 2."
        ),
        notes=(
            "At convergence it is thre-sigmoid at the same tau; a converged row (marginal error <= tol) is within "
            "about 2 tol of it. As in the authors' code the last update is the column one: sum p = k exactly, but "
            "rows only to tol, so an entry can exceed 1 by up to tol (x = 0,-25,-26, k = 2: 1 + 6.4e-10). The authors divide the cost by its batch maximum M, so their eps is tau = eps M / 2 here. "
            "Sinkhorn slows down as the selection hardens: at the default cap many rows fail below tau ~ spread / 10."
        ),
        implementation=OT_SINKHORN,
        capabilities=Capabilities(integer_k=False, potential=regularised_max(binary_entropy)),
        parameters=(
            *METHOD_PARAMETERS["ot-sinkhorn"],
        ),
        probe=ProbeReference(
            "its converged limit, thre-sigmoid at the same tau, by bisection: max_error is Sinkhorn's distance from the limit",
            threshold_bisection(f_sigmoid),
        ),
        failures=(
            FailureCode(NO_CONVERGENCE, "Sinkhorn's row-marginal error was still above tol after max-iter iterations"),
        ),
    ),
    MethodSpec(
        name="perturbed",
        summary="Perturbed top-k E[T_k(x + tau Z)], Z Gaussian (Berthet et al. 2020), by Monte Carlo with standard errors.",
        family="perturbed",
        guarantees=Guarantees(
            monotone_k=True, continuous_k=True,
            range=True, sum=True, monotone_weak=True, monotone_strict=False,
            shift_invariant=True, permutation_equivariant=True, hard_limit=True,
            softmax_at_k1=False, jacobian=False, finite=True, smoothness="discontinuous",
        ),
        reference=(
            "Berthet, Blondel, Teboul, Cuturi, Vert & Bach, NeurIPS 2020, 'Learning with differentiable perturbed "
            "optimizers' (sigma = tau); as in optax / jaxopt perturbations."
        ),
        notes=(
            "Antithetic pairs with common random numbers (the noise depends on seed, n and samples only). "
            "Range and sum are exact per sample; weak monotonicity holds in expectation and, measured by "
            "verify-properties, within 4 standard errors of the estimate. Permutation equivariance holds the same "
            "way: the expectation is exactly equivariant, but the noise is tied to positions, so a permuted row "
            "is another estimate of it (measured within 4 standard errors of each of the two estimates). The "
            "estimate is piecewise constant in x, the expectation is C-infinity. Jacobian by "
            "integration by parts, E[T_k(x + tau Z) Z^T] / tau: it estimates the derivative of the expectation "
            "(tested within its standard error against the exact one), not of the piecewise-constant estimate, "
            "whose finite differences are 0, so verify-properties' finite-difference check measures 'no'."
        ),
        implementation=PERTURBED,
        capabilities=Capabilities(integer_k=False, evaluation=Evaluation.MONTE_CARLO, probe_default=False, potential=perturbed_potential),
        parameters=(
            *METHOD_PARAMETERS["perturbed"],
        ),
        probe=ProbeReference("none: no exact value is computed"),
    ),
    MethodSpec(
        name="topk-softmax",
        summary="Pseudo-smooth top-k: 1 on the top k-1 entries, softmax over the others (discontinuous).",
        family="pseudo-smooth",
        guarantees=Guarantees(
            range=True, sum=True, monotone_weak=True, monotone_strict=False,
            shift_invariant=True, permutation_equivariant=True, hard_limit=True,
            softmax_at_k1=True, jacobian=True, finite=True, smoothness="discontinuous",
        ),
        reference="Suggested in the reader comments of Su (2024), 'Softmax sequel: finding smooth approximations of Top-K'.",
        notes=(
            "Jumps where the (k-1)-th and k-th entries swap; kept to show what a discontinuity looks like. "
            "The Jacobian is that of the current selection (no derivative exists at a swap)."
        ),
        implementation=TOPK_SOFTMAX,
        probe=ProbeReference("the closed form by a full sort and softmax in extended precision", topk_softmax_reference),
    ),
    MethodSpec(
        name="gumbel-topk",
        summary="Relaxed subset sampling (Xie & Ermon 2019): k rounds of a = softmax(w), w += log(1 - a); p = sum a.",
        family="iterative",
        guarantees=Guarantees(
            range=False, sum=True, monotone_weak=True, monotone_strict=True,
            shift_invariant=True, permutation_equivariant=True, hard_limit=False,
            softmax_at_k1=True, jacobian=True, finite=True, smoothness="C-infinity",
        ),
        reference=(
            "Xie & Ermon, IJCAI 2019, 'Reparameterizable subset sampling via continuous relaxations' "
            "(log-weights x / tau, relaxation temperature 1)."
        ),
        notes=(
            "log(1 - a) in log space, without the floor public code clips 1 - a at (which changes the map once a "
            "key leads by ~87). Entries can exceed 1 (x = 0,-1,-2, k = 3: 1.52, 1, 0.48), and its tau -> 0 limit is "
            "not hard top-k (x = 0,-1,-2, k = 2: 1.5, 0.5, 0). noise = 1 adds Gumbel keys x / tau + G (seeded, common "
            "random numbers): a Monte Carlo mean with standard errors and pathwise derivatives; the claims are "
            "those of the default, deterministic relaxation. The article divides x + sum log(1 - a) by its "
            "temperature: the same map at tau = 1 only. Cost O(n k) per row (k sequential rounds; the VJP "
            "stores them): n*k above 1e7 per row is refused."
        ),
        implementation=_gumbel.GUMBEL_TOPK,
        parameters=(
            *METHOD_PARAMETERS["gumbel-topk"],
        ),
        probe=ProbeReference(_SEQUENTIAL_REFERENCE, _gumbel.gumbel_topk_reference),
        aliases=(
            Alias("subsets", "Xie & Ermon (IJCAI 2019), 'Reparameterizable subset sampling via continuous relaxations'"),
        ),
    ),
    MethodSpec(
        name="coordinate-descent",
        summary="CoLT5's soft top-k: a fixed number of dual coordinate-descent steps towards thre-exp.",
        family="threshold",
        guarantees=Guarantees(
            range=True, sum=False, monotone_weak=True, monotone_strict=False,
            shift_invariant=False, permutation_equivariant=True, hard_limit=False,
            softmax_at_k1=False, jacobian=True, finite=True, smoothness="C0",
        ),
        reference=(
            "Ainslie et al. 2023, 'CoLT5: faster long-range transformers with conditional computation'; "
            "coor_descent of lucidrains/CoLT5-attention (eps = tau, n_iters = iterations, no eps-scaling)."
        ),
        notes=(
            "= coor_descent(x, eps = tau), on the raw scores as the public code: not shift-invariant (its first "
            "step, a = tau log(k / n), does not follow an offset of x; x = 1,0 and x = 1e6+1,1e6 differ, k = 1). "
            "Tends to thre-exp as iterations grow, slowly at small tau or far from 0: at the default 20 the sum "
            "misses k (x = 1e6,1e6, k = 1: 1, 1), so k = 1 is not softmax, and the tau -> 0 limit is not hard "
            "top-k (x = 1,2,0, k = 2, tau = 1e-3: 1, 1, 0.091; README: measured table). Where some x / tau + a is "
            "exactly 0 (x = 0 at k = n) the Jacobian is one-sided, along an increase of each entry."
        ),
        implementation=COORDINATE_DESCENT,
        parameters=(
            *METHOD_PARAMETERS["coordinate-descent"],
        ),
        probe=ProbeReference("the public update run in extended precision (np.longdouble)", coordinate_descent_reference),
        aliases=(
            Alias("colt5", "the coordinate-descent router of CoLT5 (Ainslie et al. 2023), coor_descent in lucidrains/CoLT5-attention"),
        ),
    ),
    MethodSpec(
        name="dftopk",
        summary="DFTopK: sigmoid(z - m), m the midpoint of the k-th and (k+1)-th scores; O(n), does not sum to k.",
        family="sigmoid",
        guarantees=Guarantees(
            range=True, sum=False, monotone_weak=True, monotone_strict=False,
            shift_invariant=True, permutation_equivariant=True, hard_limit=True,
            softmax_at_k1=False, jacobian=True, finite=True, smoothness="C0",
        ),
        reference=(
            "Zhu et al. 2025, 'Differentiable fast top-k selection for large-scale recommendation' (DFTopK); "
            "the authors' DFTopK.py computes the same threshold."
        ),
        notes=(
            "At k = n every weight is 1 (no (k+1)-th score). Kinks where the k-th or (k+1)-th entry changes. "
            "The hard limit holds for distinct scores; where more than two tie at the k-th value each tends to "
            "1/2 (x = 0,0,0, k = 1: 0.5 each, hard top-k 1/3). Strictly monotone in exact arithmetic, not claimed: "
            "1 - p of two scores 745 and 744.9 above the midpoint is the same subnormal float "
            "(x = 0,-749,-741,-0.1, k = 3; verify-properties --seed 9)."
        ),
        implementation=DFTOPK,
        probe=ProbeReference("the definition by a full sort, the sigmoid in extended precision", dftopk_reference),
    ),
    MethodSpec(
        name="scaled-sigmoid",
        summary="k sigmoid(z) / sum sigmoid(z), or its complementary form when that sum is below k: sums to k, no solve.",
        family="sigmoid",
        guarantees=Guarantees(
            range=True, sum=True, monotone_weak=True, monotone_strict=False,
            shift_invariant=False, permutation_equivariant=True, hard_limit=False,
            softmax_at_k1=False, jacobian=True, finite=True, smoothness="C0",
        ),
        reference=(
            "scaled_sigmoid of public code citing Pervez et al. 2023, 'Neural conditional Poisson sampling': "
            "k s / S when k <= S, else 1 - (n - k)(1 - s) / (n - S)."
        ),
        notes=(
            "Computed on the raw logits theta = x / tau, as the public code: not shift-invariant (x = 1,0 and "
            "x = 1e6+1,1e6 differ, k = 1). Its tau -> 0 limit is not hard top-k: every positive x tends to "
            "sigmoid 1, every negative one to 0 (x = 1,0, k = 1, tau = 1e-3: 2/3, 1/3; x = 2,1, k = 1: 1/2, 1/2). "
            "The derivative jumps where sum sigmoid(x / tau) crosses k. x / tau beyond float64 is refused."
        ),
        implementation=SCALED_SIGMOID,
        probe=ProbeReference("the public formula in extended precision, rows with |S - k| > 1e-9", scaled_sigmoid_reference),
    ),
    MethodSpec(
        name="k-softmax",
        summary="k * softmax(z): the naive router baseline; sums to k but entries exceed 1.",
        family="scaled-softmax",
        guarantees=Guarantees(
            range=False, sum=True, monotone_weak=True, monotone_strict=True,
            shift_invariant=True, permutation_equivariant=True, hard_limit=False,
            softmax_at_k1=True, jacobian=True, finite=True, smoothness="C-infinity",
        ),
        reference="k times the softmax (Bridle 1990): the scaled gate of mixture-of-experts routers.",
        notes="Its tau -> 0 limit is k on the largest entry. At k = 1 it is softmax: the alias 'softmax' names it at k = 1 only (refused at any other k).",
        implementation=K_SOFTMAX,
        probe=ProbeReference("k softmax(z) in extended precision", k_softmax_reference),
        aliases=(
            Alias("softmax", "softmax itself (Bridle 1990): k = 1 only; k * softmax is k-softmax", k_one=True),
        ),
    ),
    MethodSpec(
        name="straight-through",
        summary="Straight-through hard top-k: hard forward, thre-sigmoid's Jacobian and VJP backward.",
        family="surrogate-gradient",
        guarantees=Guarantees(
            range=True, sum=True, monotone_weak=True, monotone_strict=False,
            shift_invariant=True, permutation_equivariant=True, hard_limit=True,
            softmax_at_k1=False, jacobian=False, finite=True, smoothness="discontinuous",
            sparse=True,
        ),
        reference=(
            "The straight-through estimator (Bengio, Leonard & Courville 2013, 'Estimating or propagating "
            "gradients through stochastic neurons'), with thre-sigmoid's derivative."
        ),
        notes=(
            "Its Jacobian is thre-sigmoid's at the same tau, not the derivative of the forward (0 wherever it "
            "exists): verify-properties' finite-difference check measures 'no'. Hard at every tau, so a "
            "target hardness below 1 is unreachable in train-probe; compare it at fixed --taus."
        ),
        implementation=STRAIGHT_THROUGH,
        capabilities=Capabilities(probe_default=False),
        probe=ProbeReference("none: the forward is hard top-k, exact by construction"),
    ),
    MethodSpec(
        name="neuralsort",
        summary="NeuralSort (Grover et al. 2019): the sum of the first k rows of its relaxed sorting matrix.",
        family="relaxed-sort",
        guarantees=Guarantees(
            range=False, sum=True, monotone_weak=False, monotone_strict=False,
            shift_invariant=True, permutation_equivariant=True, hard_limit=True,
            softmax_at_k1=False, jacobian=False, finite=True, smoothness="C0",
        ),
        reference=(
            "Grover, Wang, Zweig & Ermon, ICLR 2019, 'Stochastic optimization of sorting networks via continuous "
            "relaxations': P[i, :] = softmax(((n + 1 - 2i) s - A_s 1) / tau), A_s = |s_j - s_l|."
        ),
        notes=(
            "Rows of P sum to 1, columns do not: sum p = k, but a weight can exceed 1 and k = n is not all ones "
            "(x = 0,-1,-2, k = 3: p = 0.947, 1.107, 0.947). C0: |s_j - s_l| has kinks where entries cross. "
            f"{_RANK_TIES} "
            f"Memory O(k n) per row; k*n above {MAX_ROW_ENTRIES} (2^25) is refused."
        ),
        implementation=NEURALSORT,
        probe=ProbeReference(
            "the definition (n + 1 - 2i) s - A_s 1 in extended precision (np.longdouble), on rows where its "
            "logits keep an absolute error below 1e-11",
            neuralsort_reference,
        ),
    ),
    MethodSpec(
        name="softsort",
        summary="SoftSort (Prillo & Eisenschlos 2020): the sum of the first k rows of softmax(-|sort(s)_i - s_j| / tau).",
        family="relaxed-sort",
        guarantees=Guarantees(
            range=False, sum=True, monotone_weak=False, monotone_strict=False,
            shift_invariant=True, permutation_equivariant=True, hard_limit=True,
            softmax_at_k1=True, jacobian=False, finite=True, smoothness="C0",
        ),
        reference=(
            "Prillo & Eisenschlos, ICML 2020, 'SoftSort: a continuous relaxation for the argsort operator' "
            "(d = |.|, as in their experiments)."
        ),
        notes=(
            "Exactly softmax at k = 1. Rows of P sum to 1, columns do not: sum p = k, but a weight can exceed 1 "
            "and k = n is not all ones. C0 (kinks where entries cross). "
            f"{_RANK_TIES} Memory O(k n) per row; k*n above {MAX_ROW_ENTRIES} (2^25) is refused."
        ),
        implementation=SOFTSORT,
        probe=ProbeReference(
            "the definition softmax(-|sort(s)_i - s_j|) in extended precision (np.longdouble)",
            softsort_reference,
        ),
    ),
    MethodSpec(
        name="sorting-network",
        summary="Differentiable odd-even sorting network (Petersen et al. 2021), logistic comparators: the k top wires.",
        family="relaxed-sort",
        guarantees=Guarantees(
            range=True, sum=True, monotone_weak=False, monotone_strict=False,
            shift_invariant=True, permutation_equivariant=False, hard_limit=True,
            softmax_at_k1=False, jacobian=True, finite=True, smoothness="discontinuous",
        ),
        reference=(
            "Petersen, Borgelt, Kuehne & Deussen, ICML 2021, 'Differentiable sorting networks for scalable sorting "
            "and ranking supervision': odd-even transposition network, logistic sigmoid with inverse temperature "
            "1/tau (diffsort's odd_even network, distribution='logistic', steepness = 1/tau)."
        ),
        notes=(
            "Each comparator mixes its two wires by alpha = sigmoid(z_b - z_a): the relaxed permutation is doubly "
            "stochastic, so 0 <= p <= 1 and sum p = k. The network compares fixed wires: the result depends on the "
            "order of the entries (not permutation-equivariant), and tied entries get different weights. "
            "Equal inputs get equal outputs here as for every method: the weights of exactly tied entries are "
            "averaged (and so are its derivatives there), so p jumps at an exact tie (k = 2: p = 0.747, 0.596, 0.657 at x = 1,0,1e-9 and at 1,1e-9,0; 0.747, 0.627, 0.627 at 1,0,0); "
            "C-infinity everywhere else. Memory O(n^2) per row (one state per comparator, n(n-1)/2); n above 8192 "
            "is refused."
        ),
        implementation=SORTING_NETWORK,
        probe=ProbeReference(
            "the network run with diffsort's formulas (1 - alpha by subtraction) in extended precision (np.longdouble)",
            sorting_network_reference,
        ),
        aliases=(
            Alias("diffsort", "diffsort's DiffSortNet (Petersen et al., ICML 2021; Felix-Petersen/diffsort), 'odd_even' network with the logistic distribution"),
        ),
    ),
)

#: Every method, by CLI name, in a stable order.
METHODS: Mapping[str, MethodSpec] = MappingProxyType({spec.name: spec for spec in _SPECS})

#: Every alias -> the CLI name of its method.
ALIASES: Mapping[str, str] = MappingProxyType({a.name: spec.name for spec in _SPECS for a in spec.aliases})

#: The method ``soft_topk`` and ``compute`` use when none is named.
DEFAULT_METHOD = "thre-laplace"

#: The exact target every smooth operator is compared with (``compute``'s hard column, sweeps).
BASELINE_METHOD = "hard"


def _check_registry() -> None:
    """Names and aliases are unique; references to other methods exist (checked at import)."""
    names = [s.name for s in _SPECS]
    every = names + [a.name for s in _SPECS for a in s.aliases]
    if len(set(every)) != len(every) or "all" in every:
        raise RuntimeError(f"method names and aliases must be unique and not 'all': {every}")
    for spec in _SPECS:
        if spec.stable_equivalent is not None and spec.stable_equivalent not in names:
            raise RuntimeError(f"{spec.name}: stable_equivalent {spec.stable_equivalent!r} is not registered")
        impl = spec.implementation
        if not spec.capabilities.integer_k and not impl.row_k:
            raise RuntimeError(f"{spec.name}: a method taking a real k needs an implementation with row_k")
        if not impl.row_k and any(h is not None for h in (impl.dk, impl.vjp_k, impl.log_weights, impl.refine)):
            # a k per row groups such an implementation's rows, carrying its forward and derivatives in z only
            raise RuntimeError(f"{spec.name}: an implementation with dk, vjp_k, log_weights or refine must be row_k")
        if spec.guarantees.smoothness not in SMOOTHNESS_CLASSES:
            raise RuntimeError(f"{spec.name}: unknown smoothness class {spec.guarantees.smoothness!r}")
    if tuple(names) != METHOD_NAMES:
        raise RuntimeError(f"topk_cli.catalog.METHOD_NAMES must list the registry's methods in order: {names}")
    if {s.name: s.parameters for s in _SPECS if s.parameters} != dict(METHOD_PARAMETERS):
        raise RuntimeError("topk_cli.catalog.METHOD_PARAMETERS must hold exactly the methods' parameters")
    operator_defaults = {
        ("ot-sinkhorn", "max_iter"): DEFAULT_MAX_ITER, ("ot-sinkhorn", "tol"): DEFAULT_TOL,
        ("perturbed", "samples"): DEFAULT_SAMPLES, ("perturbed", "seed"): DEFAULT_SEED,
        ("gumbel-topk", "samples"): _gumbel.DEFAULT_SAMPLES, ("gumbel-topk", "seed"): _gumbel.DEFAULT_SEED,
        ("coordinate-descent", "iterations"): DEFAULT_ITERATIONS,
    }
    for (method, name), value in operator_defaults.items():
        if next(p.default for p in METHODS[method].parameters if p.name == name) != value:
            raise RuntimeError(f"{method}: the default of {name} differs from the operator's ({value})")
    for default in (DEFAULT_METHOD, BASELINE_METHOD):
        if default not in names:
            raise RuntimeError(f"{default!r} is not registered")


_check_registry()


#: The aliases that name their method at k = 1 only (``softmax``).
K_ONE_ALIASES: frozenset[str] = frozenset(a.name for spec in _SPECS for a in spec.aliases if a.k_one)


def check_alias_k(name: object, ks: Iterable[float] | None) -> None:
    """Refuse an alias that means its method at k = 1 only (:attr:`Alias.k_one`) unless every k in
    ``ks`` is 1; ``ks`` None: the caller runs several k (not only 1). Any other name passes.

    Raises:
        InvalidArgumentError: one line naming the method to use for k != 1.
    """
    if not isinstance(name, str) or name not in K_ONE_ALIASES:
        return
    values = None if ks is None else [float(v) for v in ks]
    other = next((v for v in values if v != 1.0), None) if values is not None else None
    if values is not None and other is None:
        return
    method = ALIASES[name]
    got = "it would run at k other than 1" if other is None else f"got k={int(other) if other.is_integer() else other}"
    raise InvalidArgumentError(
        f"method {name!r} is softmax, defined for k = 1 only ({got}); use {method!r} for k * softmax"
    )


def _normalised(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def suggest(name: str) -> str | None:
    """The registered name or alias closest to ``name`` (case, ``_`` for ``-``, typos), or None."""
    choices = [*METHODS, *ALIASES]
    by_norm = {_normalised(c): c for c in choices}
    if _normalised(name) in by_norm:
        return by_norm[_normalised(name)]
    close = difflib.get_close_matches(_normalised(name), list(by_norm), n=1, cutoff=0.75)
    return by_norm[close[0]] if close else None


def lookup(name: object) -> MethodSpec:
    """The spec of a CLI name or alias (``lapsum`` gives ``thre-laplace``'s spec).

    Raises:
        UnknownMethodError: not a registered name or alias; the message suggests the closest
            one and lists the valid names.
    """
    if isinstance(name, str):
        if name in METHODS:
            return METHODS[name]
        if name in ALIASES:
            return METHODS[ALIASES[name]]
    hint = suggest(name) if isinstance(name, str) else None
    did_you_mean = f"did you mean {hint!r}? " if hint else ""
    aliases = ", ".join(f"{a} ({m})" for a, m in ALIASES.items())
    raise UnknownMethodError(
        f"unknown method {name!r}; {did_you_mean}valid methods: {', '.join(METHODS)}"
        + (f"; aliases: {aliases}" if aliases else "")
    )


# ---------------------------------------------------------------------------------------------
# users' operators: resolved at call time, never copied into METHODS

#: The users' operators resolved in this process, by the name the user wrote (``ops.py:my_topk``).
_USER_METHODS: dict[str, MethodSpec] = {}


def resolve(name_or_spec: object, *, framework: str | None = None, dtype: str | None = None) -> MethodSpec:
    """The spec of a registered name or alias, or of a user's operator: ``FILE.py:FUNCTION`` (a path,
    relative or absolute), ``package.module:FUNCTION`` (importable) or a callable ``fn(x, k, tau)``.

    A user's operator is loaded once per process and name (importing a file runs its code) and
    resolved again under that name; ``framework`` (``auto``, ``numpy``, ``torch``, ``jax``) and ``dtype``
    (the dtype its scores are given in) reload it when they differ from the last resolution (None:
    as last resolved, ``auto`` and float64 the first time). It claims nothing (see
    :mod:`topk_cli.frameworks.user_method`).

    Raises:
        UnknownMethodError: neither a registered name nor the form of a user's operator.
        UserOperatorError: a user's operator that cannot be loaded (one line, ``FILE:LINE: ...``).
    """
    if isinstance(name_or_spec, str) and (name_or_spec in METHODS or name_or_spec in ALIASES):
        if framework not in (None, "auto", "numpy") or dtype not in (None, "float64"):
            raise InvalidArgumentError(
                f"--framework and --dtype apply to your own operator (FILE.py:FUNCTION), not to the method {name_or_spec!r}"
            )
        return lookup(name_or_spec)
    from topk_cli.frameworks.user import is_user_spec

    if not is_user_spec(name_or_spec):
        return lookup(name_or_spec)
    from topk_cli.frameworks.user import load_user_operator
    from topk_cli.frameworks.user_method import UserMethod

    known = _user_method(name_or_spec)
    if known is not None:
        method = known[1]
        if framework in (None, method.framework_asked) and dtype in (None, method.dtype):
            return known[0]
    spec_arg = name_or_spec if isinstance(name_or_spec, str) else cast(Callable[..., Any], name_or_spec)
    op = load_user_operator(spec_arg, framework=framework or "auto")
    method = UserMethod(op, dtype or "float64", framework_asked=framework or "auto")
    spec = method.spec()
    _USER_METHODS[spec.name] = spec
    _USER_STATE[spec.name] = method
    return spec


#: The adapter behind each user's operator (its log of findings), by name.
_USER_STATE: dict[str, Any] = {}


def _user_method(name_or_spec: object) -> tuple[MethodSpec, Any] | None:
    """The spec and adapter already resolved for this string, or for this very callable."""
    if isinstance(name_or_spec, str):
        from topk_cli.frameworks.user import spec_origin

        method = _USER_STATE.get(name_or_spec)
        if method is not None and method.op.origin == spec_origin(name_or_spec):  # a relative path: same folder
            return _USER_METHODS[name_or_spec], method
        return None
    for name, method in _USER_STATE.items():
        if method.op.fn is name_or_spec:
            return _USER_METHODS[name], method
    return None


def is_user_method(name: object) -> bool:
    """True for what names a user's operator (``FILE.py:FUNCTION``, ``package.module:FUNCTION``, a
    callable) rather than a registered method or alias."""
    if isinstance(name, str) and (name in METHODS or name in ALIASES):
        return False
    from topk_cli.frameworks.user import is_user_spec

    return is_user_spec(name)


def user_seconds(name: str) -> float | None:
    """Wall seconds spent inside a user's operator's own code over every call so far in this
    process (None for a registered method): the rest of a call's time is the tool's overhead."""
    method = _USER_STATE.get(name)
    return None if method is None else float(method.log.seconds)


def runs_in_process(names: Collection[str]) -> bool:
    """True when some of ``names`` must run in this process: a user's operator is loaded here (from
    a file, a callable, possibly on a framework that does not survive a fork), and what its calls
    reveal is collected here; grids then run with one job."""
    return any(name in _USER_STATE for name in names)


def clear_user_notes() -> None:
    """Forget what the users' operators revealed so far (a command starts with none)."""
    for method in _USER_STATE.values():
        method.log.notes.clear()
        method.log.printed.clear()


def user_notes(names: Collection[str] | None = None) -> list[str]:
    """What the calls of the users' operators (among ``names``; None: all resolved ones) revealed
    besides their weights (text printed on stdout, warnings, an input modified in place, another
    dtype back, row-by-row calls), one sentence each, prefixed by the operator's name; nothing for a
    registered method."""
    out: list[str] = []
    for name in (list(_USER_STATE) if names is None else names):
        method = _USER_STATE.get(name)
        if method is None:
            continue
        out.extend(f"{name}: {note}" for note in method.log.notes)
        printed = "".join(method.log.printed)
        if printed:
            lines = printed.rstrip("\n").splitlines()
            shown = lines[:5] + ([f"... ({len(lines) - 5} more lines)"] if len(lines) > 5 else [])
            out.append(f"{name}: it printed on stdout (shown here, kept off the tool's stdout): " + " | ".join(shown))
    return out


def check_method_params(methods: Collection[str], given: Mapping[str, object]) -> dict[str, int | float]:
    """Validate the method parameters of a command (``--samples`` ...) against its selected methods.

    ``given`` maps parameter names (``samples``) to values. Each must be taken by at least one
    of ``methods`` (registered names) and be valid for every selected method that takes it
    (:meth:`ParamSpec.validate`). Every command that passes parameters to methods calls this.

    Raises:
        InvalidArgumentError: a parameter no selected method takes (the message names the
            methods that take it), or a value out of its method's range.

    >>> check_method_params(["perturbed"], {"samples": 6})
    {'samples': 6}
    """
    out: dict[str, int | float] = {}
    for name, value in given.items():
        takers = [m for m, spec in METHODS.items() if any(p.name == name for p in spec.parameters)]
        chosen = [m for m in takers if m in methods]
        if not chosen:
            option = "--" + name.replace("_", "-")
            raise InvalidArgumentError(
                f"{option} applies to {', '.join(takers) if takers else 'no method'}, and no selected method takes it"
                + (f" (add -m {takers[0]})" if takers else "")
            )
        for method in chosen:
            spec = next(p for p in METHODS[method].parameters if p.name == name)
            out[name] = spec.validate(value, method)
    return out
