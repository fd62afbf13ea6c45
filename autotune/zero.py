"""``deepspeed.zero`` where a script that changed ``deepspeed`` to ``autotune`` looks for it
(``from autotune.zero import GatheredParameters``): DeepSpeed's names, not autotune's own. The
path is kept for those scripts (the README's ``import autotune as deepspeed``); the module is
:mod:`autotune.deepspeed.zero`, which autotune's code imports.
"""

import sys

from autotune.deepspeed import zero

sys.modules[__name__] = zero
