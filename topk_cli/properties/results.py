"""What the property checks return: cases, verdicts, counterexamples, and their constants."""

from __future__ import annotations

import builtins
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Generic, Protocol, TypeVar

import numpy as np
from numpy.typing import ArrayLike

from topk_cli.operators._base import FloatArray

#: Property names, in report order (the names the JSON output uses).
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

#: Properties in k itself, measured for the methods that take a real k (after :data:`PROPERTIES`).
K_PROPERTIES: tuple[str, ...] = ("monotone-k", "continuous-k")

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
#: Cases with a non-integer k added to those of ``smooth`` and ``jacobian`` (methods taking one).
_MAX_REAL_K_SMOOTH_CASES = 2
_MAX_REAL_K_JACOBIAN_CASES = 12
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
    k: int | float  # an int, or a non-integer real k (methods that take one)
    tau: float = 1.0
    label: str = ""

    @cached_property
    def array(self) -> FloatArray:
        """``x`` as a float64 array, built once per case and read-only (every check reads it)."""
        arr = np.asarray(self.x, dtype=np.float64)
        arr.flags.writeable = False
        return arr


@dataclass(frozen=True)
class Counterexample:
    """A concrete (shrunk) input on which a property fails, ready to paste."""

    method: str
    x: tuple[float, ...]
    k: int | float
    tau: float
    detail: str
    k2: int | float | None = None  # a property in k: the second k the failure compares with

    @property
    def command(self) -> str:
        """The ``softtopk compute`` command that shows the failure (two, joined by ``&&``, for a
        property in k: the same vector at ``k`` and at ``k2``)."""
        values = ",".join(_fmt(v) for v in self.x)
        ks = (self.k,) if self.k2 is None else (self.k, self.k2)
        return " && ".join(
            f"softtopk compute -m {self.method} -k {_fmt_k(k)} --tau {_fmt(self.tau)} --values={values}" for k in ks
        )

    def as_dict(self) -> dict[str, object]:
        """JSON-able form (the ``counterexample`` object of the JSON output)."""
        out: dict[str, object] = {
            "x": list(self.x), "k": self.k, "tau": self.tau, "detail": self.detail, "command": self.command,
        }
        if self.k2 is not None:
            out["k2"] = self.k2
        return out


@dataclass(frozen=True)
class PropertyResult:
    """The measured verdict of one method on one property.

    ``holds`` is None when no case was applicable (e.g. ``softmax-at-k1`` without ``k = 1``);
    ``expected`` is the registry's claim; ``worst`` the largest violation measured (0 when it
    holds exactly; None when nothing was measured); ``checked``/``skipped``/``violations`` count
    cases; ``smoothness`` is the measured class (``smooth`` only); ``within_stderr`` is set for a
    Monte-Carlo method: violations were judged beyond that many standard errors of its estimate;
    ``dtype`` and ``tolerance``: the dtype a user's operator received its scores in and the
    tolerance its row was judged with (the rows of :mod:`topk_cli.properties.user` only).
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
    within_stderr: float | None = None
    dtype: str | None = None  # the dtype a user's operator received its scores in (its own rows)
    tolerance: float | None = None  # the tolerance of a user operator's row (its own rows)

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
    reference: str | None = None  # the method users' operators were compared with (``--reference``)
    dtype: str = "float64"  # the dtype users' operators received their scores in (``--dtype``)
    unclaimed: tuple[str, ...] = ()  # users' operators without a reference: they claim nothing

    @property
    def disagreements(self) -> tuple[PropertyResult, ...]:
        """Results where the measurement contradicts the registry's claim (a method that claims
        nothing, a user's operator without a reference, disagrees with nothing)."""
        return tuple(r for r in self.results if not r.agrees and r.method not in self.unclaimed)

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
    slack: float = 0.0  # a Monte-Carlo method's allowance: MONTE_CARLO_STDERRS standard errors, in units of value


def _fmt(v: float) -> str:
    """Shortest text that reads back as the same float64 (``2`` for 2.0)."""
    text = repr(float(v))
    return text[:-2] if text.endswith(".0") else text


def _fmt_k(k: int | float) -> str:
    """``k`` as the command line reads it back: ``2`` for an integer, the shortest float text else."""
    return str(k) if isinstance(k, (int, np.integer)) else _fmt(k)


def _vec(a: ArrayLike, digits: int = 4) -> str:
    arr = np.asarray(a, dtype=np.float64)
    return "[" + ", ".join(f"{float(v):.{digits}g}" for v in arr) + "]"


class _Scored(Protocol):
    @property
    def value(self) -> float: ...

    @property
    def slack(self) -> float: ...


_M = TypeVar("_M", bound=_Scored)


@dataclass
class Tally(Generic[_M]):
    """The cases a property was measured on: how many, the worst violation, how many violate it
    (``value > tol + slack``) and the worst of those (``bad``: its measure and case)."""

    tol: float
    worst: float | None = None
    bad: tuple[_M, Case] | None = None
    checked: int = 0
    violations: int = 0

    def add(self, case: Case, m: _M) -> None:
        self.checked += 1
        if math.isfinite(m.value) or m.value == math.inf:
            self.worst = m.value if self.worst is None else max(self.worst, m.value)
        if m.value > self.tol + m.slack:
            self.violations += 1
            if self.bad is None or m.value > self.bad[0].value:
                self.bad = (m, case)

    def settled(
        self, method: str, prop: str, expected: bool, skipped: int, within: float | None
    ) -> PropertyResult | None:
        """The result when nothing was measured (not applicable) or nothing violates the property
        (holds); None when a violation needs its counterexample."""
        if self.checked == 0:
            return PropertyResult(
                method, prop, expected, None, None, None, 0, skipped, detail="not applicable to these inputs",
                within_stderr=within,
            )
        if self.bad is None:
            return PropertyResult(
                method, prop, expected, True, self.worst, None, self.checked, skipped, within_stderr=within
            )
        return None
