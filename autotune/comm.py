"""``deepspeed.comm`` where a script that changed ``deepspeed`` to ``autotune`` looks for it
(``import autotune.comm as dist``): DeepSpeed's names, not autotune's own. The path is kept for
those scripts (the README's ``import autotune as deepspeed``); the module is
:mod:`autotune.deepspeed.comm`, which autotune's code imports.
"""

import sys

from autotune.deepspeed import comm

sys.modules[__name__] = comm
