"""Pure numpy implementations of the smooth top-k operators, one module per family.

These functions work on validated, shifted, scaled 2-D batches (see ``_base``); users call
:mod:`topk_cli.api` (re-exported as ``topk_cli.soft_topk`` etc.) instead.
"""
