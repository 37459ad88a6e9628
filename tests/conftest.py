"""Shared pytest fixtures: one seeded random generator per test, its seed shown in the header."""

from __future__ import annotations

import numpy as np
import pytest

RNG_SEED = 20240611


def pytest_report_header() -> str:
    """Shows the seed every ``rng`` fixture starts from."""
    return f"rng seed: {RNG_SEED}"


@pytest.fixture
def rng() -> np.random.Generator:
    """A fresh generator per test; messages print ``rng.bit_generator.seed_seq.entropy``."""
    return np.random.default_rng(RNG_SEED)
