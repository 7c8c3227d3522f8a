"""The front-door gaps suite (test_jit_gaps.py: closures, globals, autocast, dynamo wrappers)
through the ThunderFX backend (issue 12); see thunderfx_harness.py for how and what a pass proves."""
from __future__ import annotations

from thunderlite.tests.test_jit_gaps import *  # noqa: F403  (the suite, collected again)
from thunderlite.tests.thunderfx_harness import backend_fixture

_DIFFERENT_BY_DESIGN: dict[str, str] = {
    "test_nonlocal_tensor_write_hits_cache_and_uses_run_outputs":
        "checks thunderlite.jit's own cache statistics (cache_info); "
        "behind torch.compile dynamo's guards decide recompiles",
    "test_autocast_at_call_time_matches_eager_values_dtypes_and_grads":
        "checks thunderlite.jit's own cache statistics (cache_info); behind torch.compile dynamo's guards decide "
        "recompiles (values, dtypes and grads are compared before and pass)",
    "test_autocast_region_inside_jitted_code_matches_eager":
        "checks thunderlite.jit's own cache statistics (cache_info); behind torch.compile dynamo's guards decide "
        "recompiles (values are compared before and pass)",
    "test_dynamo_disable_wrapper_is_looked_through":
        "under torch.compile a torch._dynamo.disable'd function is a graph break: dynamo runs it eagerly, "
        "so its op is in no thunderlite trace",
}

_through_backend = backend_fixture(_DIFFERENT_BY_DESIGN)
