"""The framework layer: what runs on PyTorch or JAX arrays (the drop-in operators' shared plumbing,
adapters for users' operators). torch and JAX are imported inside functions, only when used."""
