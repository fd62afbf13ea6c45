"""The engine that measures an experiment: one object per ``autotuning.engine``, looked up by
name, and a spec that names it as results directories always have (by value)."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.config.autotuning import EngineName
from autotune.experiment import ExperimentSpec
from autotune.results import ResultsDir
from autotune.runner import deepspeed_engine
from autotune.runner.measuring_engine import measuring_engine
from tests.results.records import FINGERPRINT, commit, make_result
from tests.runner.specs import spec

# A spec.json as results directories hold it (written before the spec's engine was typed).
SPEC_JSON = """{
  "name": "z1_mbs2",
  "ds_config": {
    "train_micro_batch_size_per_gpu": 2,
    "zero_optimization": {
      "stage": 1
    }
  },
  "workload": "gpt",
  "workload_args": {},
  "world_size": 2,
  "start_profile_step": 2,
  "end_profile_step": 4,
  "timeout_s": 60.0,
  "seed": 0,
  "cpus_per_rank": 1,
  "device_memory_bytes": null,
  "flops_per_sample": null,
  "script": null,
  "output_dir": null,
  "client_config": null,
  "engine": "deepspeed",
  "stop_above_step_s": null,
  "repeat_of": null
}"""


@pytest.mark.parametrize("name", list(EngineName))
def test_every_engine_name_has_its_measuring_engine(name: EngineName) -> None:
    engine = measuring_engine(name)
    assert engine.name is name
    # Only DeepSpeed keeps process state a failure may leave half set up, and enforces no budget.
    assert engine.fresh_after_failure == (name is EngineName.deepspeed)
    assert engine.enforces_memory_budget == (name is EngineName.builtin)


def test_a_spec_json_loads_and_is_written_back_byte_for_byte() -> None:
    loaded = ExperimentSpec.from_dict(json.loads(SPEC_JSON))
    assert loaded.engine is EngineName.deepspeed
    assert json.dumps(loaded.to_dict(), indent=2) == SPEC_JSON
    assert spec("a").engine is EngineName.builtin


def test_the_results_log_names_the_engine_by_value(tmp_path: Path) -> None:
    results = ResultsDir.open(tmp_path / "run", FINGERPRINT)
    try:
        commit(results, spec("a", engine=EngineName.deepspeed), make_result("a"))
        (record,) = results.records()
    finally:
        results.close()
    assert record["engine"] == "deepspeed"


def test_summaries_name_deepspeed_with_its_installed_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    assert measuring_engine(EngineName.builtin).label == "autotune's built-in ZeRO engine"
    monkeypatch.setattr(deepspeed_engine.importlib.metadata, "version", lambda _: "0.16.4")
    assert measuring_engine(EngineName.deepspeed).label == "DeepSpeed 0.16.4"
    monkeypatch.setattr(deepspeed_engine.importlib.metadata, "version", missing)
    assert measuring_engine(EngineName.deepspeed).label == "DeepSpeed"


def test_the_driver_asks_without_loading_torch_or_an_engine() -> None:
    # The CLI checks the job and names the engine before anything starts; a fresh interpreter,
    # since this one has long since imported torch.
    probe = (
        "import json, sys, autotune.runner.measuring_engine; "
        "print(json.dumps([m for m in ('torch', 'deepspeed', 'autotune.engine') "
        "if m in sys.modules]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
