"""``deepspeed.zero`` under autotune's name, one module (:mod:`autotune.deepspeed.zero`)."""

import sys

from autotune.deepspeed import zero

sys.modules[__name__] = zero
