"""Shared set-up for the model tests: offline HF, per-test wall time printing."""
from __future__ import annotations

import os
import time

import pytest

# Before any transformers import: random-weight models are built from configs in code,
# nothing may be downloaded.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@pytest.fixture(autouse=True)
def _wall_time(request):
    """Print each test's wall time (shown with -s); module fixtures count in the first test."""
    t0 = time.perf_counter()
    yield
    print(f"\n[wall] {request.node.nodeid}: {time.perf_counter() - t0:.2f} s")
