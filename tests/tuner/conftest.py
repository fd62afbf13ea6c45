"""The fixture that runs a test once per tuner type; the tuners are built in ``tuners.py``."""

from __future__ import annotations

import pytest

from tests.tuner.tuners import TUNERS


@pytest.fixture(params=TUNERS)
def tuner_type(request: pytest.FixtureRequest) -> str:
    return str(request.param)
