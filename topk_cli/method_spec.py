"""What a method is, claims and can do: the record type of the registry (:class:`MethodSpec`).

:mod:`topk_cli.registry` holds one :class:`MethodSpec` per method; this module defines the record
and its parts (:class:`Guarantees`, :class:`Capabilities`, :class:`ParamSpec`,
:class:`ProbeReference`, :class:`FailureCode`, :class:`StabilityModel`, :class:`Alias`) and how a
spec binds its parameters into an :class:`~topk_cli.operators._base.Implementation`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from functools import partial
from typing import Any, cast

from topk_cli.catalog import ParamSpec as ParamSpec  # defined without numpy, for the command line
from topk_cli.errors import InvalidArgumentError
from topk_cli.operators._base import FloatArray, Implementation
from topk_cli.operators.grad_recursive import RecursionTrace
from topk_cli.operators.potentials import PotentialFn
from topk_cli.recursion import RecursionOutlook
from topk_cli.references import ReferenceContext, ReferenceFn

#: Smoothness classes, from best to worst.
SMOOTHNESS_CLASSES = ("C-infinity", "C1", "C0", "discontinuous")

#: A Monte-Carlo method is judged within this many of its standard errors (per weight) by
#: ``verify-properties`` and ``stability-probe``: a deviation beyond 4 standard errors has
#: probability below 1e-4 per weight under the normal approximation.
MONTE_CARLO_STDERRS = 4.0


@dataclass(frozen=True)
class Guarantees:
    """What a method claims, one flag per property of ``verify-properties``.

    Field names are the property names with ``-`` written ``_``; :meth:`as_dict` gives the
    property names. ``smoothness`` is the claimed class; ``smooth`` (C1 or better) derives
    from it. ``sparse`` means the result can hold exact zeros for finite inputs.
    ``monotone_k`` and ``continuous_k``: each ``p_i`` is non-decreasing and continuous in a real k
    (claimed only by methods that take one).
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
    monotone_k: bool = False
    continuous_k: bool = False

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


class Evaluation(str, Enum):
    """How a method computes its weights."""

    EXACT = "exact"  # deterministic, to float64 accuracy (or the row is refused)
    MONTE_CARLO = "monte-carlo"  # an estimate; ``Forward.aux["stderr"]`` holds the standard error per weight


@dataclass(frozen=True)
class FailureCode:
    """A status code a method may report for a row, with what it means."""

    code: str
    meaning: str


#: Codes the public API itself may set for any method (a result that is not finite).
COMMON_FAILURES = (FailureCode("nan", "the method returned a non-finite weight on this row"),)


@dataclass(frozen=True)
class Alias:
    """Another name of a method, and where that name comes from.

    ``k_one``: the name means the method at k = 1 only (``softmax`` is ``k-softmax`` at k = 1); the
    API and the CLI refuse it at any other k (:func:`topk_cli.registry.check_alias_k`).
    """

    name: str
    reference: str
    k_one: bool = False


@dataclass(frozen=True)
class ProbeReference:
    """What ``stability-probe`` measures a method's ``max_error`` against.

    ``compute(z, k, ctx) -> (weights, trusted rows)`` (see ``topk_cli.references``) or None
    when there is no independent reference; ``description`` is shown in the output.
    """

    description: str
    compute: ReferenceFn | None = None


@dataclass(frozen=True)
class StabilityModel:
    """A method whose breakdown can be traced and predicted without running it.

    ``trace(z, k)`` runs the method's algorithm recording where it breaks (per row);
    ``outlook(z, k, ctx)`` predicts it from an exact computation. ``stability-probe`` reports
    observed and predicted boundaries; ``compute`` warns about rows near the boundary.
    """

    description: str
    trace: Callable[[FloatArray, int], RecursionTrace]
    outlook: Callable[[FloatArray, int, ReferenceContext | None], RecursionOutlook]


@dataclass(frozen=True)
class Capabilities:
    """What a method can do, as opposed to what it claims (:class:`Guarantees`).

    ``evaluation``: exact or Monte Carlo (then judged within :data:`MONTE_CARLO_STDERRS`
    standard errors); ``jacobian``: has a Jacobian and VJP; ``integer_k``: defined for integer
    ``k`` only (False: the method takes any real ``0 < k <= n``, its implementation declares
    ``row_k``, and ``dp/dk`` where it has a ``dk`` hook; every method takes a k per row);
    ``probe_default``: probed by
    ``stability-probe`` when no method is named; ``potential``: ``Phi(z)`` with
    ``grad Phi = p`` (``topk_cli.operators.potentials``), or None when the method is not the
    gradient of a potential.
    """

    evaluation: Evaluation = Evaluation.EXACT
    jacobian: bool = True
    integer_k: bool = True
    probe_default: bool = True
    potential: PotentialFn | None = None

    @property
    def monte_carlo(self) -> bool:
        """True for a Monte-Carlo estimate."""
        return self.evaluation is Evaluation.MONTE_CARLO


@dataclass(frozen=True)
class MethodSpec:
    """One registered method; see the module docstring for what each field drives.

    ``stable_equivalent`` names a registered method computing the same map stably (failures of
    this one advise it).
    """

    name: str
    summary: str
    family: str
    guarantees: Guarantees
    reference: str
    implementation: Implementation = field(repr=False, compare=False)
    notes: str = ""
    capabilities: Capabilities = Capabilities()
    parameters: tuple[ParamSpec, ...] = ()
    probe: ProbeReference = ProbeReference("none")
    failures: tuple[FailureCode, ...] = ()
    aliases: tuple[Alias, ...] = ()
    stability: StabilityModel | None = field(default=None, repr=False, compare=False)
    stable_equivalent: str | None = None

    def resolve_params(self, params: Mapping[str, object] | None = None) -> dict[str, int | float]:
        """Every parameter of the method: the given ones validated, the others at their default.

        Raises:
            InvalidArgumentError: a parameter the method does not take, or a value out of range.
        """
        given = dict(params or {})
        known = {p.name: p for p in self.parameters}
        unknown = sorted(set(given) - set(known))
        if unknown:
            takes = ", ".join(known) if known else "none"
            raise InvalidArgumentError(
                f"method {self.name!r} has no parameter {unknown[0]!r} (its parameters: {takes})"
            )
        return {name: p.validate(given[name], self.name) if name in given else p.default for name, p in known.items()}

    def bind(self, params: Mapping[str, object] | None = None) -> Implementation:
        """The implementation with the (validated) parameters bound as keyword arguments.

        Without parameters this is :attr:`implementation` itself (the operators' signatures are
        unchanged); each of ``forward``, ``jacobian``, ``vjp`` and the hooks (``dk``,
        ``log_weights``, ``refine``) receives the parameters its signature names (all of them if it
        takes ``**kwargs``).
        """
        values = self.resolve_params(params)
        if not values:
            return self.implementation
        impl = self.implementation
        return replace(
            impl,
            forward=cast(Any, _bound(impl.forward, values)),
            jacobian=cast(Any, _bound(impl.jacobian, values)),
            vjp=cast(Any, _bound(impl.vjp, values)),
            dk=None if impl.dk is None else cast(Any, _bound(impl.dk, values)),
            vjp_k=None if impl.vjp_k is None else cast(Any, _bound(impl.vjp_k, values)),
            log_weights=None if impl.log_weights is None else cast(Any, _bound(impl.log_weights, values)),
            refine=None if impl.refine is None else cast(Any, _bound(impl.refine, values)),
        )

    def failure_meaning(self, code: str) -> str | None:
        """The sentence registered for a failure code of this method (None if unknown)."""
        return next((f.meaning for f in (*self.failures, *COMMON_FAILURES) if f.code == code), None)


def _bound(func: Callable[..., Any], values: Mapping[str, int | float]) -> Callable[..., Any]:
    sig = inspect.signature(func)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return partial(func, **values)
    taken = {name: value for name, value in values.items() if name in sig.parameters}
    return partial(func, **taken) if taken else func
