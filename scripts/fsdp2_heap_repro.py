"""Stress check for a fixed bug: ``thunderlite.jit`` over a ``fully_shard`` model
on two gloo ranks used to die in a rank with glibc's "malloc(): unaligned tcache
chunk detected" (SIGABRT) or a SIGSEGV in about one run in four. The cause was
gloo's coalesced all-gather (``_c10d_functional.all_gather_into_tensor``) with two
gathers in flight; the ``dist.all_gather`` symbol now uses
``all_gather_into_tensor_out`` (docs/architecture.md §15). The script exercises
mixed precision and ``reshard_after_forward`` under the prefetching schedule.

Run it in a loop: ``for i in $(seq 20); do python scripts/fsdp2_heap_repro.py || echo FAIL; done``.
"""
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import thunderlite


def worker(rank: int, world: int, path: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world)
    init_device_mesh("cpu", (world,))
    for it in range(6):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(7, 33), torch.nn.LayerNorm(33), torch.nn.GELU(),
                                  torch.nn.Linear(33, 17), torch.nn.Linear(17, 5))
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if it % 2 \
            else MixedPrecisionPolicy()
        for m in net:
            if isinstance(m, torch.nn.Linear):
                fully_shard(m, reshard_after_forward=bool(it % 3), mp_policy=policy)
        fully_shard(net, mp_policy=policy)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
        jnet = thunderlite.jit(net)
        for _ in range(3):
            jnet(torch.randn(6, 7)).float().square().mean().backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2, os.path.join(tempfile.mkdtemp(), "store")), nprocs=2)
    print("ok")
