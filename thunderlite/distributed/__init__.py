"""``thunderlite.distributed``: data parallelism under ``thunderlite.jit``.

- ``ddp(module)``: gradients all-reduced inside the backward trace, bucketed
  and overlapped with the rest of the backward; ``no_sync()`` for gradient
  accumulation (``ddp.py``).

The collectives themselves (``torch.distributed.all_reduce`` and friends,
functional collectives) are traced as symbols by the torch language
(``thunderlite/torch/distributed.py``), so they also work directly inside any
jitted function. Launch on CPU with gloo::

    torchrun --nproc-per-node 2 train.py
"""
from thunderlite.distributed.ddp import DDPModule, DDPTransform, ddp

__all__ = ["ddp", "DDPModule", "DDPTransform"]
