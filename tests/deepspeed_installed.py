"""``needs_deepspeed``: skips a test where no usable DeepSpeed is installed (the tests that
measure on DeepSpeed itself; ``bash install.sh dev`` installs it)."""

from __future__ import annotations

import pytest

from autotune.runner.deepspeed_engine import DeepSpeedUnavailable, installed_deepspeed


def _deepspeed_installed() -> bool:
    try:
        installed_deepspeed()
    except DeepSpeedUnavailable:
        return False
    return True


needs_deepspeed = pytest.mark.skipif(not _deepspeed_installed(), reason="needs DeepSpeed")
