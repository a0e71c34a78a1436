"""Fixtures shared by more than one test folder."""
from __future__ import annotations

import pytest

from rockjit.runtime import fake_rocket


@pytest.fixture
def fake():
    """A clean fake kernel; after the test every fd and BO must be gone."""
    fake_rocket.reset()
    yield fake_rocket
    fake_rocket.set_faults()
    s = fake_rocket.stats()
    assert s["open_fds"] == 0 and s["live_bos"] == 0, f"fake rocket leaked: {s}"
