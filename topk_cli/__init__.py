"""softtopk: compute, compare and stress-test smooth top-k operators.

>>> import topk_cli as st
>>> st.soft_topk([1.0, 3.0, 2.0], 1, "hard")
array([0., 1., 0.])
"""

from topk_cli._lazy import lazy_getattr

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (start-up time of the CLI)

if TYPE_CHECKING:
    from topk_cli.analysis.hardness import HardnessMatch, tau_for_hardness
    from topk_cli.api import (
        TopKResult,
        TopKSum,
        evaluate,
        evaluate_sum,
        get_method,
        jacobian,
        log_soft_topk,
        scaled_scores,
        soft_topk,
        soft_topk_sum,
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
    from topk_cli.registry import ALIASES, METHODS, Capabilities, Guarantees, MethodSpec, ParamSpec

#: Where each public name lives: imported on first use, so ``softtopk --version`` and the CLI's
#: argument parsing do not pay for numpy and every operator module.
_LAZY = {
    "HardnessMatch": "topk_cli.analysis.hardness",
    "tau_for_hardness": "topk_cli.analysis.hardness",
    **{name: "topk_cli.api" for name in (
        "TopKResult", "TopKSum", "evaluate", "evaluate_sum", "get_method", "jacobian", "log_soft_topk", "scaled_scores",
        "soft_topk", "soft_topk_sum", "trace_grad_recursive", "vjp",
    )},
    **{name: "topk_cli.errors" for name in (
        "InputError", "InvalidArgumentError", "NumericalFailureError", "RowFailure", "SoftTopKError",
        "UnknownMethodError",
    )},
    **{name: "topk_cli.registry" for name in (
        "ALIASES", "METHODS", "Capabilities", "Guarantees", "MethodSpec", "ParamSpec",
    )},
}


__getattr__ = lazy_getattr(__name__, _LAZY, globals())


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__version__ = "0.1.0"

__all__ = [
    "ALIASES",
    "METHODS",
    "Capabilities",
    "Guarantees",
    "HardnessMatch",
    "InputError",
    "InvalidArgumentError",
    "MethodSpec",
    "NumericalFailureError",
    "ParamSpec",
    "RowFailure",
    "SoftTopKError",
    "TopKResult",
    "TopKSum",
    "UnknownMethodError",
    "__version__",
    "evaluate",
    "evaluate_sum",
    "get_method",
    "jacobian",
    "log_soft_topk",
    "scaled_scores",
    "soft_topk",
    "soft_topk_sum",
    "tau_for_hardness",
    "trace_grad_recursive",
    "vjp",
]
