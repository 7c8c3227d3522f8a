"""A training step traced as one program: ``backward()``/``torch.autograd.grad``
inside the jitted function and the ``.grad`` of leaves as trace values
(traced_autograd.py).

May import what frontend may import (executors, transforms, the torch
language, core, interpreter) and the frontend modules beside it; never ``api``
or the front doors above it."""
