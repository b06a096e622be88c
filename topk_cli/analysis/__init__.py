"""Analyses behind the ``temperature-sweep`` and ``stability-probe`` commands.

Pure computation on the library: result dataclasses, no printing, no files, randomness only
through an explicit ``numpy.random.Generator``.
"""
