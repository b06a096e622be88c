"""The names the command line lists, importable without numpy: methods, their parameters, input formats.

The command line builds its ``-m`` help, its method-parameter options (``--samples``,
``--seed``, ``--max-iter``, ``--tol``) and its ``--input-format`` choices from this module, so
``softtopk --help`` and argument parsing never import the operators or the readers. :mod:`topk_cli.registry` takes each method's
``parameters`` from :data:`METHOD_PARAMETERS` (one definition) and checks at import that
:data:`METHOD_NAMES` lists its methods in its order and that every default here equals the
operator's own default.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, cast

from topk_cli.errors import InvalidArgumentError


@dataclass(frozen=True)
class ParamSpec:
    """An extra parameter of a method (e.g. ``samples``, ``seed``, ``max_iter``, ``tol``).

    ``name`` is the Python keyword (``soft_topk(..., max_iter=50)``); :attr:`option` the CLI flag
    (``--max-iter``). ``kind`` is ``int`` or ``float``; ``minimum``/``maximum`` are inclusive
    bounds (None: unbounded); ``multiple_of`` (integers only) a required divisor, e.g. 2 for
    an even count. The implementation's ``forward``, ``jacobian`` and ``vjp`` receive it as a
    keyword argument (each only if its signature names it).
    """

    name: str
    kind: type
    default: int | float
    help: str
    minimum: float | None = None
    maximum: float | None = None
    multiple_of: int | None = None

    @property
    def option(self) -> str:
        """The CLI flag: ``--`` and the name with ``-`` for ``_``."""
        return "--" + self.name.replace("_", "-")

    def rule(self) -> str:
        """What a valid value is, e.g. ``an even integer in [4, 10000000]``."""
        if self.kind is int:
            what = "an even integer" if self.multiple_of == 2 else "an integer"
            if self.multiple_of not in (None, 1, 2):
                what = f"an integer multiple of {self.multiple_of}"
        else:
            what = "a finite number"
        if self.maximum is None:
            return what if self.minimum is None else f"{what} >= {_num(self.minimum)}"
        if self.minimum is None:
            return f"{what} <= {_num(self.maximum)}"
        return f"{what} in [{_num(self.minimum)}, {_num(self.maximum)}]"

    def validate(self, value: object, method: str) -> int | float:
        """The value converted to :attr:`kind`, or :class:`InvalidArgumentError` naming the rule."""
        rule = f"{self.name} of method {method!r} must be {self.rule()}"
        if isinstance(value, bool) or type(value).__name__ == "bool_" or not hasattr(value, "__float__"):
            raise InvalidArgumentError(f"{rule}, got {value!r}")
        try:
            number = float(cast(Any, value))
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"{rule}, got {value!r}") from None
        if not math.isfinite(number) or (self.kind is int and not number.is_integer()):
            raise InvalidArgumentError(f"{rule}, got {value!r}")
        if (self.minimum is not None and number < self.minimum) or (self.maximum is not None and number > self.maximum):
            raise InvalidArgumentError(f"{rule}, got {value!r}")
        if self.kind is int and self.multiple_of and int(number) % self.multiple_of:
            raise InvalidArgumentError(f"{rule}, got {value!r}")
        return int(number) if self.kind is int else number


def _num(bound: float | None) -> str:
    if bound is None:
        return "..."
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


#: Input formats, for ``--input-format`` and suffix detection (:mod:`topk_cli.inputs` reads them).
INPUT_FORMATS: tuple[str, ...] = ("csv", "tsv", "json", "jsonl", "npy", "npz")
#: Other names of those formats (as suffixes and as ``--input-format`` values).
INPUT_FORMAT_ALIASES: dict[str, str] = {"tab": "tsv", "ndjson": "jsonl", "txt": "csv"}  # .txt: np.savetxt's default, separator sniffed

#: Every method's CLI name, in the registry's order.
METHOD_NAMES: tuple[str, ...] = (
    "hard", "iterative", "weighted-softmax", "grad", "grad-recursive", "thre-exp", "thre-sigmoid",
    "thre-laplace", "thre-clip", "thre-cube", "ot-sinkhorn", "perturbed", "topk-softmax",
    "gumbel-topk", "coordinate-descent", "dftopk", "scaled-sigmoid", "k-softmax", "straight-through",
    "neuralsort", "softsort", "sorting-network",
)

#: The extra parameters of each method that has any (the registry's ``MethodSpec.parameters``).
METHOD_PARAMETERS: Mapping[str, tuple[ParamSpec, ...]] = MappingProxyType({
    "ot-sinkhorn": (
        ParamSpec("max_iter", int, 200, "Sinkhorn iteration cap (the authors' default is 200)", minimum=1, maximum=10_000_000),
        ParamSpec("tol", float, 1e-13, "tolerance on the row-marginal error max |m rowmass - 1|", minimum=1e-15, maximum=1.0),
    ),
    "perturbed": (
        ParamSpec("samples", int, 1000, "Monte Carlo samples (even: antithetic pairs)", minimum=4, maximum=10_000_000, multiple_of=2),
        ParamSpec("seed", int, 0, "seed of the Gaussian noise", minimum=0),
    ),
    "gumbel-topk": (
        ParamSpec("noise", int, 0, "1 adds Gumbel keys (a Monte Carlo mean over the samples), 0 is the deterministic relaxation", minimum=0, maximum=1),
        ParamSpec("samples", int, 100, "Monte Carlo samples of the Gumbel keys (with noise 1)", minimum=4, maximum=10_000_000, multiple_of=2),
        ParamSpec("seed", int, 0, "seed of the Gumbel keys (with noise 1)", minimum=0),
    ),
    "coordinate-descent": (
        ParamSpec("iterations", int, 20, "coordinate-descent iterations (n_iters of CoLT5-attention's router: 20)", minimum=1, maximum=100_000),
    ),
})
