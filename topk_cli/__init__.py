"""softtopk: compute, compare and stress-test smooth top-k operators.

>>> import topk_cli as st
>>> st.soft_topk([1.0, 3.0, 2.0], 1, "hard")
array([0., 1., 0.])
"""

from topk_cli.analysis.hardness import HardnessMatch, tau_for_hardness
from topk_cli.api import (
    TopKResult,
    evaluate,
    get_method,
    jacobian,
    scaled_scores,
    soft_topk,
    trace_grad_recursive,
    vjp,
)
from topk_cli.errors import (
    InputError,
    InvalidArgumentError,
    NumericalFailureError,
    RowFailure,
    SoftTopKError,
    UnknownMethodError,
)
from topk_cli.registry import METHODS, Guarantees, MethodSpec

__version__ = "0.1.0"

__all__ = [
    "METHODS",
    "Guarantees",
    "HardnessMatch",
    "InputError",
    "InvalidArgumentError",
    "MethodSpec",
    "NumericalFailureError",
    "RowFailure",
    "SoftTopKError",
    "TopKResult",
    "UnknownMethodError",
    "__version__",
    "evaluate",
    "get_method",
    "jacobian",
    "scaled_scores",
    "soft_topk",
    "tau_for_hardness",
    "trace_grad_recursive",
    "vjp",
]
