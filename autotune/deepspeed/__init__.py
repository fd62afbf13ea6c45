"""What ``import deepspeed`` gives a training script, a Hugging Face ``Trainer`` or Accelerate
where autotune stands in for DeepSpeed: the built-in engine behind DeepSpeed's names.

Two ways in: a script changes its import to ``import autotune as deepspeed`` (the top-level
package re-exports these names), or autotune installs this package as ``deepspeed`` in the
processes it runs a script in (:mod:`autotune.deepspeed.stand_in`), so that ``import deepspeed``
and ``from deepspeed.<module> import ...`` resolve here and the installed-package checks of
transformers and accelerate find a ``deepspeed`` distribution of :data:`SERVED_VERSION`.

The served modules, in DeepSpeed's layout (:data:`SERVED_MODULES`): ``comm``, ``zero``,
``accelerator``, ``utils`` and ``utils.logging``, ``runtime.engine`` (``DeepSpeedEngine``),
``runtime.lr_schedules``, ``runtime.zero.partition_parameters`` (with ``ZeroParamStatus``),
``checkpoint.utils``, ``ops.adam`` and ``ops.adagrad``. A name of
DeepSpeed's that is not served raises an ``AttributeError`` that says so, never a silent
stand-in.
"""

from __future__ import annotations

from autotune.lazy import lazy_getattr

# The DeepSpeed release whose API this surface reports (importlib.metadata and __version__),
# with autotune's own version as the local label, decided from the clients' own version gates
# (transformers 5.24, Accelerate 1.15, TRL 1.16, PEFT 0.21, Lightning 2.6): Lightning refuses a
# DeepSpeed older than 0.16.0 under torch >= 2.6, and Accelerate gates what the engine does not
# do on later releases (engine.compile from 0.14.4, AutoTP from 0.16.4, Ulysses sequence
# parallelism from 0.18.2), each only where the user turned it on. At 0.18.2 every one of those
# gates is open, so a feature the user turned on reaches autotune's own refusal naming it,
# rather than the client's advice to upgrade DeepSpeed, which could not help.
SERVED_VERSION = "0.18.2"
__version__ = f"{SERVED_VERSION}+autotune"

# Every module a client may import, relative to the package: one list, for the package's own
# attributes and for the stand-in that serves them as ``deepspeed.<name>``.
SERVED_MODULES = (
    "accelerator",
    "checkpoint",
    "checkpoint.utils",
    "comm",
    "ops",
    "ops.adagrad",
    "ops.adam",
    "runtime",
    "runtime.engine",
    "runtime.lr_schedules",
    "runtime.zero",
    "runtime.zero.partition_parameters",
    "utils",
    "utils.logging",
    "zero",
)

_NAMES = {
    "initialize": "autotune.engine.entry",
    "DeepSpeedEngine": "autotune.deepspeed.runtime.engine",
    "add_config_arguments": "autotune.engine.launch",
    "init_distributed": "autotune.engine.launch",
}

__getattr__ = lazy_getattr(
    "autotune.deepspeed",
    _NAMES,
    [name for name in SERVED_MODULES if "." not in name],
    not_served="DeepSpeed",
)

__all__ = [
    "SERVED_MODULES",
    "SERVED_VERSION",
    "DeepSpeedEngine",
    "__version__",
    "add_config_arguments",
    "init_distributed",
    "initialize",
]
