"""Analyses behind the ``temperature-sweep`` and ``stability-probe`` commands.

Pure computation on the library: result dataclasses, no printing, no files, randomness only
through an explicit ``numpy.random.Generator``.
"""

from topk_cli.analysis.probe import grad_recursive_outlook as grad_recursive_outlook
from topk_cli.analysis.probe import stability_probe as stability_probe
from topk_cli.analysis.sweep import temperature_sweep as temperature_sweep
