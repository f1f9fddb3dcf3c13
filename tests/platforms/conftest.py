"""Every test in tests/platforms/ is marked ``platforms`` (run by scripts/test_platforms.sh)."""

import pytest

from tests.conftest import mark_every_test_in

pytest_collection_modifyitems = mark_every_test_in(__file__, pytest.mark.platforms)
