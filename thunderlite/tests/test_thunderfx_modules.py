"""The module front-door suite (test_jit_modules.py)
through the ThunderFX backend (issue 12); see thunderfx_harness.py for how and what a pass proves."""
from __future__ import annotations

from thunderlite.tests.test_jit_modules import *  # noqa: F403  (the suite, collected again)
from thunderlite.tests.thunderfx_harness import backend_fixture

_DIFFERENT_BY_DESIGN: dict[str, str] = {
    "test_mlp_matches_and_keeps_module_surface":
        "torch.compile's OptimizedModule prefixes state_dict keys with '_orig_mod.' "
        "(torch.compile's own surface, not thunderlite's)",
    "test_state_dict_load_changes_results":
        "loads an un-prefixed state_dict into torch.compile's OptimizedModule, whose keys carry '_orig_mod.'",
    "test_changing_a_module_flag_recompiles":
        "checks thunderlite.jit's own cache statistics (cache_info); "
        "behind torch.compile dynamo's guards decide recompiles",
    "test_hooks_added_and_attributes_changed_after_compiling_are_seen":
        "torch.compile does not guard on module hooks (torch._dynamo.config.skip_nnmodule_hook_guards, on by "
        "default): a hook added after the first call is not seen, with any backend",
    "test_new_shapes_respecialize_module":
        "checks thunderlite.jit's own cache statistics (cache_info); "
        "behind torch.compile dynamo's guards decide recompiles",
}

_through_backend = backend_fixture(_DIFFERENT_BY_DESIGN)
