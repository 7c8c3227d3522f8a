"""The test_jit_modules.py suite again, every size symbolic (tests/dynamic_harness.py)."""
from thunderlite.tests.dynamic_harness import dynamic_fixture
from thunderlite.tests.test_jit_modules import *  # noqa: F403

_dynamic = dynamic_fixture()
