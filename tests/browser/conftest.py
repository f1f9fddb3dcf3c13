"""Every test in tests/browser/ is marked ``browser``."""

import pytest

from tests.conftest import mark_every_test_in

pytest_collection_modifyitems = mark_every_test_in(__file__, pytest.mark.browser)
