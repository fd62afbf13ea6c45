"""``deepspeed.accelerator`` where a script that changed ``deepspeed`` to ``autotune`` looks for
it (``from autotune.accelerator import get_accelerator``): DeepSpeed's names, not autotune's
own. The path is kept for those scripts (the README's ``import autotune as deepspeed``); the
module is :mod:`autotune.deepspeed.accelerator`, which autotune's code imports.
"""

import sys

from autotune.deepspeed import accelerator

sys.modules[__name__] = accelerator
