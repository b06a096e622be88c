"""STUB: to be replaced by the real implementation."""

from topk_cli.operators._base import Implementation


def _todo(*args, **kwargs):
    raise NotImplementedError

ITERATIVE = Implementation(forward=_todo, jacobian=_todo, vjp=_todo)
WEIGHTED_SOFTMAX = Implementation(forward=_todo, jacobian=_todo, vjp=_todo)
