"""What a process gets where autotune stands in for DeepSpeed (``python -m autotune.deepspeed``):
a version every client's gate accepts, the names they import, and a refusal that names what
the engine does not do. Run in a child process: standing in re-imports the clients."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHECKS = """
import importlib.metadata, logging
from packaging.version import Version

import deepspeed
import autotune.deepspeed as served

version = importlib.metadata.version("deepspeed")
assert version == deepspeed.__version__ == served.__version__, version
# Lightning's floor under torch >= 2.6, and Accelerate's gates (engine.compile, AutoTP,
# Ulysses): all open, so what the user turns on reaches the engine's own refusal.
for gate in ("0.9.3", "0.14.4", "0.16.0", "0.16.4", "0.18.2"):
    assert Version(version) >= Version(gate), (version, gate)
try:
    from lightning_utilities.core.imports import RequirementCache
except ImportError:
    pass
else:
    assert RequirementCache("deepspeed>=0.16.0")

# DeepSpeed's logging is its own module (Lightning sets its logger's level).
from deepspeed.utils import logger
assert deepspeed.utils.logging is not logging and deepspeed.utils.logging.logger is logger
deepspeed.utils.logging.logger.setLevel(logging.WARNING)

from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
assert [s.value for s in ZeroParamStatus] == [1, 2, 3]
from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad

try:
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
except ModuleNotFoundError as refused:
    assert "deepspeed.runtime.sequence_parallel is not served" in str(refused)
else:
    raise AssertionError("Ulysses served")
try:
    deepspeed.tp_model_init
except AttributeError as refused:
    assert "tp_model_init is not served by autotune's built-in engine" in str(refused)
else:
    raise AssertionError("AutoTP served")
print("stand-in ok")
"""


def test_clients_find_a_version_they_accept_and_the_names_they_import(tmp_path: Path) -> None:
    script = tmp_path / "checks.py"
    script.write_text(CHECKS)
    done = subprocess.run(
        [sys.executable, "-m", "autotune.deepspeed", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and "stand-in ok" in done.stdout, done.stdout + done.stderr
