"""``deepspeed.comm`` under autotune's name, one module (:mod:`autotune.deepspeed.comm`)."""

import sys

from autotune.deepspeed import comm

sys.modules[__name__] = comm
