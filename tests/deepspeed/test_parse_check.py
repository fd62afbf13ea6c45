"""The training command is asked of the script's own parser before it is printed
(:func:`autotune.deepspeed.launcher.parse_problem`): accepted, or the script's error in one
line; the script stops once parsed, so nothing trains."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.deepspeed.launcher import parse_problem, training_command
from autotune.script_target import ScriptTarget

ARGPARSE_SCRIPT = """
import argparse
parser = argparse.ArgumentParser()
parser.add_argument("--deepspeed")
parser.add_argument("--per_device_train_batch_size", type=int)
args = parser.parse_args()
raise SystemExit("trained: the check went past the parser")
"""

HF_SCRIPT = """
from dataclasses import dataclass
from transformers import HfArgumentParser

@dataclass
class Args:
    deepspeed: str = ""

HfArgumentParser(Args).parse_args_into_dataclasses()
raise SystemExit("trained: the check went past the parser")
"""


@pytest.mark.slow  # a fresh process imports torch for the stand-in
def test_an_argparse_script_is_asked_and_stopped_once_parsed(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(ARGPARSE_SCRIPT)
    assert parse_problem([str(script), "--deepspeed", "ds.json"], 2) is None
    refused = parse_problem([str(script), "--deepspeed_config", "ds.json"], 2)
    assert refused is not None and "unrecognized arguments: --deepspeed_config" in refused
    target = ScriptTarget.from_command([str(script), "--per_device_train_batch_size", "1"])
    printed = training_command(
        target, {}, tmp_path / "ds_config_optimal.json", ["autotune", "exec", "--"], 2
    )
    # No config argument of its own: --deepspeed_config is added, and this script refuses it.
    assert printed.startswith("(none: the script refused the command made for it:")


@pytest.mark.slow  # transformers' import in a fresh process
def test_an_hf_argument_parser_script_is_asked(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    script = tmp_path / "train.py"
    script.write_text(HF_SCRIPT)
    assert parse_problem([str(script), "--deepspeed", "ds.json"], 2) is None
    refused = parse_problem([str(script), "--deepspeed_config", "ds.json"], 2)
    assert refused is not None and "not used by the HfArgumentParser" in refused
