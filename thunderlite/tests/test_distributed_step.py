"""A whole training step jitted as one function over torch's distributed
models (issue 37): ``loss.backward()``, clipping and the optimizer inside the
trace with a DDP, FSDP2 (``fully_shard``) or tensor-parallel model. Two gloo
ranks against one process on the whole batches (dist_step_workers.py, one
spawn); what the traces order and what is refused, on a one-rank group in
this process."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import thunderlite
from thunderlite.tests import dist_step_workers as w
from thunderlite.tests.test_distributed import _spawn

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available in this build")


def test_two_ranks_whole_steps_match_single_process():
    _spawn(w.whole_steps_match_single_process)
