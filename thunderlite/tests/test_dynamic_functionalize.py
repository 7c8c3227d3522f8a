"""The test_functionalize.py suite again, every size symbolic (tests/dynamic_harness.py)."""
from thunderlite.tests.dynamic_harness import dynamic_fixture
from thunderlite.tests.test_functionalize import *  # noqa: F403

_dynamic = dynamic_fixture()
