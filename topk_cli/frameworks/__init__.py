"""The framework layer: where PyTorch and JAX meet the numpy core.

Only this package (and the public drop-ins ``topk_cli.torch`` / ``topk_cli.jax``) may import torch or
JAX, and only inside functions, when a framework is actually used: ``import topk_cli`` never loads
either. :mod:`topk_cli.frameworks.user` runs a user's own operator (numpy, PyTorch or JAX) guarded,
converting arrays and dtypes at one seam and taking gradients from the framework's autodiff.
"""
