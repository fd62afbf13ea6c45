"""``deepspeed.accelerator`` under autotune's name: :mod:`autotune.deepspeed.accelerator`."""

import sys

from autotune.deepspeed import accelerator

sys.modules[__name__] = accelerator
