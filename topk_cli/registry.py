"""The registry of methods: one explicit tuple of frozen specs, exposed as ``METHODS``.

A spec says what a method is (summary, family, reference) and what it *claims*. The claims are
not copied from the source articles: each was measured by ``softtopk verify-properties`` and
is tested against the same checks (``tests/test_properties.py``), so a claim here is a claim the
tool will defend. Where an article asserts more, the README says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType

from topk_cli.operators._base import Implementation
from topk_cli.operators.gradtopk import GRAD, GRAD_RECURSIVE
from topk_cli.operators.hard import HARD
from topk_cli.operators.sequential import ITERATIVE, WEIGHTED_SOFTMAX
from topk_cli.operators.threshold import THRE_EXP, THRE_LAPLACE, THRE_SIGMOID

#: Smoothness classes, from best to worst.
SMOOTHNESS_CLASSES = ("C-infinity", "C1", "C0", "discontinuous")


@dataclass(frozen=True)
class Guarantees:
    """What a method claims, one flag per property of ``verify-properties``.

    Field names are the property names with ``-`` written ``_``; :meth:`as_dict` gives the
    property names. ``smoothness`` is the claimed class; ``smooth`` (C1 or better) derives
    from it. ``sparse`` means the result can hold exact zeros for finite inputs.
    """

    range: bool
    sum: bool
    monotone_weak: bool
    monotone_strict: bool
    shift_invariant: bool
    permutation_equivariant: bool
    hard_limit: bool
    softmax_at_k1: bool
    jacobian: bool
    finite: bool
    smoothness: str
    sparse: bool = False

    @property
    def smooth(self) -> bool:
        """Continuously differentiable (C1) or better."""
        return self.smoothness in ("C-infinity", "C1")

    def as_dict(self) -> dict[str, bool]:
        """Claims keyed by property name (``monotone-weak``, ..., ``smooth``)."""
        out = {
            f.name.replace("_", "-"): getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("smoothness", "sparse")
        }
        out["smooth"] = self.smooth
        return out


@dataclass(frozen=True)
class MethodSpec:
    """One registered method: CLI name, one-line summary, family, claims, reference."""

    name: str
    summary: str
    family: str
    guarantees: Guarantees
    reference: str
    notes: str = ""
    implementation: Implementation = field(repr=False, compare=False, default=HARD)


_SPECS: tuple[MethodSpec, ...] = (
    MethodSpec(
        name="hard",
        summary="Hard top-k T_k(x): 1 on the k largest entries, ties at the k-th value share the rest.",
        family="baseline",
        guarantees=Guarantees(
            range=True, sum=True, monotone_weak=True, monotone_strict=False,
            shift_invariant=True, permutation_equivariant=True, hard_limit=True,
            softmax_at_k1=False, jacobian=True, finite=True, smoothness="discontinuous",
            sparse=True,
        ),
        reference="The k-hot indicator; the target every smooth operator approximates.",
        notes="Piecewise constant: its Jacobian is 0 wherever it exists.",
        implementation=HARD,
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
            "(x = 2,1,2,0, k = 2: limit 0.833, 0.333, 0.833, 0)."
        ),
        implementation=ITERATIVE,
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
            "a pole, rounding differences between equivalent orderings grow without bound."
        ),
        implementation=WEIGHTED_SOFTMAX,
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
    ),
    MethodSpec(
        name="thre-exp",
        summary="Threshold top-k with f = min(1, exp): entropy-regularised LP over the capped simplex.",
        family="threshold",
        guarantees=Guarantees(
            range=True, sum=True, monotone_weak=True, monotone_strict=False,
            shift_invariant=True, permutation_equivariant=True, hard_limit=True,
            softmax_at_k1=True, jacobian=True, finite=True, smoothness="C0",
        ),
        reference="Su (2024) ThreTopK with min(1, e^x); entropic regularisation over D(n,k).",
        notes="Kink where z_i = lambda; the Jacobian takes the saturated side (p_i = 1) there.",
        implementation=THRE_EXP,
    ),
    MethodSpec(
        name="thre-sigmoid",
        summary="Threshold top-k with f = sigmoid, lambda solved to full float64 precision.",
        family="threshold",
        guarantees=Guarantees(
            range=True, sum=True, monotone_weak=True, monotone_strict=True,
            shift_invariant=True, permutation_equivariant=True, hard_limit=True,
            softmax_at_k1=False, jacobian=True, finite=True, smoothness="C-infinity",
        ),
        reference="Su (2024) ThreTopK with sigmoid; = LML (Amos et al. 2019); limit of entropic-OT SOFT top-k (Xie et al. 2020).",
        implementation=THRE_SIGMOID,
    ),
    MethodSpec(
        name="thre-laplace",
        summary="Threshold top-k with f = Laplace CDF: closed form after a sort, C1.",
        family="threshold",
        guarantees=Guarantees(
            range=True, sum=True, monotone_weak=True, monotone_strict=True,
            shift_invariant=True, permutation_equivariant=True, hard_limit=True,
            softmax_at_k1=False, jacobian=True, finite=True, smoothness="C1",
        ),
        reference="Su (2024) ThreTopK with the Laplace CDF; = LapSum top-k (ICML 2025).",
        notes="Equals softmax at k = 1 only while every softmax weight is below 1/2 (the article claims it always does).",
        implementation=THRE_LAPLACE,
    ),
)

#: Every method, by CLI name, in a stable order.
METHODS: Mapping[str, MethodSpec] = MappingProxyType({spec.name: spec for spec in _SPECS})
