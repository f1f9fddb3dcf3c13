"""Every test in tests/xla/ is marked ``xla``."""

import pytest

from tests.conftest import mark_every_test_in

pytest_collection_modifyitems = mark_every_test_in(__file__, pytest.mark.xla)
