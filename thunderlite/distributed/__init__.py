"""``thunderlite.distributed``: data and model parallelism under ``thunderlite.jit``.

- ``ddp(module)``: gradients all-reduced inside the backward trace, bucketed
  and overlapped with the rest of the backward; ``no_sync()`` for gradient
  accumulation (``ddp.py``).
- ``fsdp(module)``: parameters sharded (ZeRO-3), gathered where the forward
  uses them and again in the backward (or kept: ``reshard_after_forward=False``),
  gradients reduce-scattered; ``full_state_dict`` (``fsdp.py``).

The collectives themselves (``torch.distributed.all_reduce`` and friends,
functional collectives) are traced as symbols by the torch language
(``thunderlite/torch/ops/distributed.py``), so they also work directly inside any
jitted function. Launch on CPU with gloo::

    torchrun --nproc-per-node 2 train.py

Also ``from_torch_ddp``/``from_data_parallel`` (``ddp.py``),
``from_torch_fsdp2`` (``fsdp2.py``) and ``from_torch_tp`` (``tp.py``, over
``views.py``): what ``thunderlite.jit`` compiles for torch's own wrappers
(DDP, FSDP2's ``fully_shard``, ``parallelize_module``), and ``stand_in.py``
the same views for such a model called inside a jitted function; ``in_step.py``
a DDP model called inside one, its gradients averaged by the program's own
backward (a whole training step); ``dtensor.py``:
``DTensor`` s inside traced programs (``DTensorProxy``, used by ``frontend``).
Its modules may import ``transforms``, the torch language and ``core`` (no
executor, ``frontend`` or ``api``, which import it).
"""
from thunderlite.distributed.ddp import DDPModule, DDPTransform, ddp
from thunderlite.distributed.fsdp import FSDPModule, FSDPTransform, fsdp, full_state_dict

__all__ = ["ddp", "DDPModule", "DDPTransform", "fsdp", "FSDPModule", "FSDPTransform", "full_state_dict"]
