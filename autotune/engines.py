"""Which engine measures experiments (``autotuning.engine``): how each is named, what it
needs installed, and what it leaves behind in a process. Torch-free: the driver checks the
job before anything starts (importing DeepSpeed probes accelerators and takes seconds).

The rank side of DeepSpeed is :mod:`autotune.runner.deepspeed_engine`.
"""

from __future__ import annotations

import importlib.metadata
import re

BUILTIN_LABEL = "autotune's built-in ZeRO engine"
# The oldest DeepSpeed whose ``initialize`` / engine API this runner calls as it does.
MIN_VERSION = (0, 14, 0)
# Engines whose process state is reset after a clean experiment but not trusted after a
# failed one (a failure can leave anything half set up): their gang is then replaced.
FRESH_AFTER_FAILURE = frozenset({"deepspeed"})


class DeepSpeedUnavailable(RuntimeError):
    """``autotuning.engine`` is ``deepspeed`` but no usable DeepSpeed is installed."""


def installed_deepspeed() -> str:
    """The installed DeepSpeed's version, checked against :data:`MIN_VERSION`, without
    importing it (importing DeepSpeed probes accelerators and takes seconds).

    Raises:
        DeepSpeedUnavailable: none is installed, or it is older than :data:`MIN_VERSION`.
    """
    wanted = ".".join(map(str, MIN_VERSION))
    try:
        version = importlib.metadata.version("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        raise DeepSpeedUnavailable(
            f"autotuning.engine is 'deepspeed' but DeepSpeed is not installed here: "
            f"pip install 'deepspeed>={wanted}' (or autotune's 'deepspeed' extra)"
        ) from None
    if "+autotune" in version:  # autotune's own stand-in, inside an experiment
        raise DeepSpeedUnavailable(
            "autotuning.engine is 'deepspeed' but 'deepspeed' is autotune's stand-in here"
        )
    numbers = tuple(int(n) for n in re.findall(r"\d+", version)[:3])
    if numbers < MIN_VERSION:
        raise DeepSpeedUnavailable(
            f"autotuning.engine is 'deepspeed' but DeepSpeed {version} is installed; autotune "
            f"drives DeepSpeed >= {wanted}"
        )
    return version


def label(engine: str) -> str:
    """How summaries name ``engine`` (DeepSpeed's with the installed version)."""
    if engine != "deepspeed":
        return BUILTIN_LABEL
    try:
        return f"DeepSpeed {installed_deepspeed()}"
    except DeepSpeedUnavailable:
        return "DeepSpeed"
