"""The in-place suite (test_inplace_jit.py) through the ThunderFX backend
(issue 12); see thunderfx_harness.py for how and what a pass proves."""
from __future__ import annotations

from thunderlite.tests.test_inplace_jit import *  # noqa: F403  (the suite, collected again)
from thunderlite.tests.thunderfx_harness import backend_fixture

_DIFFERENT_BY_DESIGN: dict[str, str] = {
    "test_out_of_another_shape_is_a_clear_error":
        "dynamo runs out= into a tensor of another shape itself (eager resizes it with a warning); "
        "the backend never sees the call that thunderlite.jit refuses",
    "test_shape_changing_inplace_ops_are_refused_with_the_line":
        "through the backend a piece thunderlite refuses runs on the fallback with eager's result "
        "(test_thunderfx.py checks that path and its report) instead of raising",
}

_through_backend = backend_fixture(_DIFFERENT_BY_DESIGN)
