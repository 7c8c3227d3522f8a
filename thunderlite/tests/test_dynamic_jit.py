"""The test_jit.py suite again, every size symbolic (tests/dynamic_harness.py)."""
from thunderlite.tests.dynamic_harness import dynamic_fixture
from thunderlite.tests.test_jit import *  # noqa: F403

_dynamic = dynamic_fixture({
    "test_last_traces_every_stage_headed_and_last_one_ran":
        "calls the final trace with the program's arguments only; a trace with symbolic sizes also takes its size "
        "symbols (the entry function passes them)"})
