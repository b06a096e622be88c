"""Analyses behind the ``temperature-sweep`` and ``stability-probe`` commands.

Pure computation on the library: result dataclasses, no printing, no files, randomness only
through an explicit ``numpy.random.Generator``.

The entry points below load on first use, so that importing one light module of the package
(``topk_cli.analysis.hardness`` on the ``compute`` path) does not import the probe and the sweep.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from topk_cli._lazy import lazy_getattr

if TYPE_CHECKING:
    from topk_cli.analysis.probe import grad_recursive_outlook as grad_recursive_outlook
    from topk_cli.analysis.probe import stability_probe as stability_probe
    from topk_cli.analysis.sweep import temperature_sweep as temperature_sweep

_LAZY = {
    "grad_recursive_outlook": "topk_cli.analysis.probe",
    "stability_probe": "topk_cli.analysis.probe",
    "temperature_sweep": "topk_cli.analysis.sweep",
}

__all__ = sorted(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY, globals())
