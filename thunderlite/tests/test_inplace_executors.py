"""The in-place suite and the alias fuzzer with each fusion executor ahead of
torch (issue 10: ``executors=[X, "torch"]``).

Every test of test_inplace_jit.py is collected here again and runs once per
fusion executor, which an autouse fixture puts at the front of the default
executor list (so each ``thunderlite.jit(fn)`` there means
``jit(fn, executors=[X, "torch"])``). To keep the suite affordable on CPU the
torch.compile executor runs with the ``aot_eager`` backend: Dynamo and
AOTAutograd trace each region exactly as with Inductor (the same region
former, the same graph capture, the same alias handling), only Inductor's code
generation is skipped; ``test_fuzz_with_inductor`` runs a few fuzz seeds with
real Inductor. The gradient fuzzer (test_fuzz_inplace_grad.py) runs with each
executor too. Triton runs its generated kernels natively on a GPU and under
Triton's interpreter on CPU (skipped with the reason when triton is not
installed). nvFuser runs where it is available (CUDA + nvfuser_direct) and is
skipped with the reason otherwise. The fuzzer's randomly reordering fusion
executor (``shuffle``) runs the suite too, so the order of every write and the
reads around it must be carried by the trace's dependencies alone (the
"return is last" test included).
"""
import pytest

from thunderlite.executors.nvfuser.executor import NvFuserExecutor
from thunderlite.executors.torchcompile import TorchCompileExecutor
from thunderlite.executors.triton.executor import TritonExecutor
from thunderlite.extend import add_default_executor, get_executor, remove_default_executor
from thunderlite.tests import test_fuzz_inplace_grad
from thunderlite.tests.test_fuzz_inplace_jit import ShuffleFusion, check_seed
from thunderlite.tests.test_inplace_jit import *  # noqa: F403  (re-collected once per executor)

_EXECUTORS = {
    "torchcompile": TorchCompileExecutor("torchcompile_aot_eager", compile_options={"backend": "aot_eager"}),
    "nvfuser": NvFuserExecutor("nvfuser_inplace"),
    "triton": TritonExecutor("triton_inplace"),
    "shuffle": ShuffleFusion(1_000_003),     # fuses a random choice of symbols in a random valid order
}


@pytest.fixture(autouse=True, params=sorted(_EXECUTORS))
def fusion_executor_first(request):
    ex = _EXECUTORS[request.param]
    ok, reason = ex.is_available()
    if not ok:
        pytest.skip(f"{request.param} executor unavailable: {reason}")
    add_default_executor(ex)
    try:
        yield ex
    finally:
        remove_default_executor(ex)


@pytest.mark.parametrize("chunk", range(3))
def test_fuzz_inplace_with_fusion_executor(chunk, fusion_executor_first):
    for seed in range(chunk * 25, (chunk + 1) * 25):
        check_seed(seed, executors=[fusion_executor_first, "torch"])


def test_fuzz_with_inductor(fusion_executor_first):
    if fusion_executor_first.name != "torchcompile_aot_eager":
        pytest.skip("the Inductor run is the torchcompile one")
    ok, reason = get_executor("torchcompile").is_available()
    if not ok:
        pytest.skip(f"torchcompile unavailable: {reason}")
    for seed in range(4):
        check_seed(seed, executors=["torchcompile", "torch"])


def test_fuzz_inplace_grad_with_fusion_executor(fusion_executor_first):
    """Writes into arguments and their views on a gradient path (functionalized,
    written back after the forward) with the fusion executor first."""
    for seed in range(25):
        test_fuzz_inplace_grad.check_seed(seed, executors=[fusion_executor_first, "torch"])
