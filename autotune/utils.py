"""``deepspeed.utils`` under autotune's name, one module (:mod:`autotune.deepspeed.utils`)."""

import sys

from autotune.deepspeed import utils

sys.modules[__name__] = utils
