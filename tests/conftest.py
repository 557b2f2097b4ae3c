"""Shared test setup. TRITON_INTERPRET must be set before triton is first imported (CPU machines)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# Property tests must not fail because the machine is busy: no per-example deadline, and no health check
# on how long data generation takes (both are timings). Per-test settings inherit these.
settings.register_profile("minirunner", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.load_profile("minirunner")


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False,
                     help="also run tests marked slow (long property and metamorphic sweeps)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-slow") or os.environ.get("MINIRUNNER_RUN_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: run with --run-slow (or MINIRUNNER_RUN_SLOW=1)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
