"""The test_alias_views.py suite again, every size symbolic (tests/dynamic_harness.py)."""
from thunderlite.tests.dynamic_harness import dynamic_fixture
from thunderlite.tests.test_alias_views import *  # noqa: F403

_dynamic = dynamic_fixture()
