"""Reverse-mode autodiff over traces: the forward/backward split (``split``),
VJP rules (``rules``, ``torch_rules``, ``attention``, ``collective_rules``), the symbols only
autodiff emits, fused ATen kernels, traced ``autograd.Function``s,
rematerialization and executor-owned differentiation.

May import ``core``, the torch language and ``transforms.aliasing`` and other
passes in ``transforms``; never an executor module.
"""
