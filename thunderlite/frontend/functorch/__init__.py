"""``torch.func`` inside a traced program: grad, vjp, jvp, jacrev, jacfwd,
hessian, vmap and functional_call become trace computations (subtrace.py
records the transformed function into a scratch trace, apis.py transforms it
with ``transforms/autodiff/inline.py`` and ``transforms/batching.py``).

May import what frontend may import (executors, transforms, the torch
language, core, interpreter) and the frontend modules beside it; never ``api``
or the front doors above it."""
