"""Compiled functions on the rocket fake hold its fds until collected; reference cycles
(Compiled -> runner -> program -> device) keep them past a test's end, and the next suite's
fake fixture would find them open. Collect after every test here."""
from __future__ import annotations

import gc

import pytest


@pytest.fixture(autouse=True)
def _collect_devices():
    yield
    gc.collect()
