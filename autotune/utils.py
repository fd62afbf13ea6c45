"""``deepspeed.utils`` where a script that changed ``deepspeed`` to ``autotune`` looks for it
(``from autotune.utils import logger, log_dist``): DeepSpeed's names, not autotune's own. The
path is kept for those scripts (the README's ``import autotune as deepspeed``); the module is
:mod:`autotune.deepspeed.utils`, which autotune's code imports.
"""

import sys

from autotune.deepspeed import utils

sys.modules[__name__] = utils
