"""STUB: to be replaced by the real implementation."""

from topk_cli.operators._base import Implementation


def _todo(*args, **kwargs):
    raise NotImplementedError

THRE_EXP = Implementation(forward=_todo, jacobian=_todo, vjp=_todo)
THRE_SIGMOID = Implementation(forward=_todo, jacobian=_todo, vjp=_todo)
THRE_LAPLACE = Implementation(forward=_todo, jacobian=_todo, vjp=_todo)
