"""``autotuning.engine: deepspeed``: experiments measured on the installed DeepSpeed's own
engine, in fresh Ray rank actors, with the built-in engine's phases, statuses and results.

The end-to-end tests need DeepSpeed (the ``deepspeed`` extra; CPU via ``DS_ACCELERATOR=cpu``,
which the rank sets); the rest run anywhere."""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import json
import mmap
import os
import re
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import autotune.job
from autotune.cli import app
from autotune.config import load_config
from autotune.config.autotuning import EngineName
from autotune.job import TuningJob
from autotune.results import load_results
from autotune.runner import deepspeed_engine
from autotune.runner.deepspeed_engine import STALE_AGE_S, clear_leftovers
from autotune.runner.measuring_engine import measuring_engine
from autotune.script_target import ScriptTarget
from tests.deepspeed_installed import needs_deepspeed

SCRIPT = Path(__file__).with_name("ds_script.py")
cli = CliRunner()


def shared_buffers() -> set[str]:
    """The CPU all-reduce buffers DeepSpeed has in /dev/shm for this user."""
    return set(glob.glob(f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_*"))


def buffers_left(before: set[str], wait_s: float = 30.0) -> set[str]:
    """The buffers named since ``before`` that stay named for ``wait_s``.

    A leaked buffer of this run stays until the machine restarts (what the tests check). A
    neighbour on the machine, another run of this suite as the same user, has buffers of its
    own from an experiment's start to its first step (seconds, under load): a new name is
    waited out rather than taken for ours."""
    deadline = time.monotonic() + wait_s
    while (new := shared_buffers() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    return new


def write_config(tmp_path: Path, **overrides: Any) -> Path:
    config: dict[str, Any] = {
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "train_micro_batch_size_per_gpu": [4],
        "zero_optimization": {"stage": [0, 1, 2, 3]},
        "autotuning": {
            "engine": "deepspeed",
            "start_profile_step": 2,
            "end_profile_step": 3,
            "tuner_type": "gridsearch",
            "num_remeasure": 0,
            "timeout_s": 120,
        },
    }
    for key, value in overrides.items():
        if key == "autotuning":
            config["autotuning"].update(value)
        else:
            config[key] = value
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    return path


def test_the_engine_is_part_of_the_job() -> None:
    builtin = TuningJob(load_config({"train_micro_batch_size_per_gpu": 2}, world_size=2))
    deepspeed = TuningJob(
        load_config(
            {"train_micro_batch_size_per_gpu": 2, "autotuning": {"engine": "DeepSpeed"}},
            world_size=2,
        )
    )
    assert builtin.fingerprint()["tuned"]["engine"] == "builtin"
    assert deepspeed.fingerprint()["tuned"]["engine"] == "deepspeed"


def test_on_cpu_deepspeed_is_bounded_by_the_hosts_ram_not_the_stand_in_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(autotune.job, "_has_cuda", lambda: False)
    monkeypatch.setattr(autotune.job, "_host_memory_bytes", lambda: 24 * 2**30)

    def job(engine: str, **config: Any) -> TuningJob:
        settings = {"train_micro_batch_size_per_gpu": 2, "autotuning": {"engine": engine}}
        return TuningJob(load_config({**settings, **config}, world_size=2))

    assert job("builtin").memory_budget == 512 * 2**20  # the engine enforces the stand-in
    assert job("deepspeed").memory_budget == 12 * 2**30  # nothing enforces it on DeepSpeed
    assert job("deepspeed", device_memory_bytes="4GiB").memory_budget == 4 * 2**30


def test_without_deepspeed_the_run_stops_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(deepspeed_engine.importlib.metadata, "version", missing)
    results = tmp_path / "results"
    outcome = cli.invoke(app, ["run", "--engine", "deepspeed", "--results-dir", str(results)])
    assert outcome.exit_code == 2
    assert "DeepSpeed is not installed" in outcome.output
    assert "deepspeed>=0.14.0" in outcome.output
    assert not results.exists()


def test_a_deepspeed_too_old_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deepspeed_engine.importlib.metadata, "version", lambda _: "0.9.5")
    with pytest.raises(deepspeed_engine.DeepSpeedUnavailable, match=r"0\.9\.5 is installed"):
        deepspeed_engine.installed_deepspeed()


def test_the_training_command_runs_the_engine_that_measured() -> None:
    target = ScriptTarget.from_command([str(SCRIPT), "--deepspeed", "ds.json"])
    builtin = target.command({}, "best.json", measuring_engine(EngineName.builtin).launcher(2))
    deepspeed = target.command({}, "best.json", measuring_engine(EngineName.deepspeed).launcher(2))
    assert builtin[:2] == ["autotune", "exec"]
    assert deepspeed[:4] == ["torchrun", "--standalone", "--nproc_per_node", "2"]
    assert deepspeed[4:] == [str(SCRIPT), "--deepspeed", "best.json"]


@needs_deepspeed
@pytest.mark.ray
@pytest.mark.multirank
def test_a_workload_is_tuned_on_deepspeed_at_every_stage_and_resumes(
    ray_cluster: str, tmp_path: Path
) -> None:
    config, results = write_config(tmp_path), tmp_path / "results"
    args = ["run", "-c", str(config), "--results-dir", str(results), "-q", "--workload", "mlp"]
    buffers_before = shared_buffers()
    first = cli.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert not buffers_left(buffers_before)  # none of them left in RAM
    frame = load_results(results)
    assert list(frame["status"]) == ["ok"] * 4, frame[["name", "status", "error"]]
    assert set(frame["zero_stage"]) == {0, 1, 2, 3}
    assert set(frame["engine"]) == {"deepspeed"}
    assert (frame["throughput"] > 0).all() and (frame["peak_memory_bytes"] > 0).all()
    summary = (results / "summary.txt").read_text()
    assert re.search(r"measured on: DeepSpeed \d+\.\d+", summary)

    again = cli.invoke(app, args)
    assert again.exit_code == 0, again.output
    assert "4 from earlier runs" in again.stdout
    assert len(load_results(results)) == 4


@needs_deepspeed
@pytest.mark.ray
@pytest.mark.multirank
@pytest.mark.slow
def test_a_deepspeed_script_is_tuned_on_deepspeed_with_its_failures_recorded(
    ray_cluster: str, tmp_path: Path
) -> None:
    mapping = {"train_micro_batch_size_per_gpu ": "--per_device_train_batch_size"}
    config = write_config(
        tmp_path,
        train_micro_batch_size_per_gpu=[4, 8],
        zero_optimization={"stage": [0, 3]},
        autotuning={"arg_mappings": mapping},
    )
    results = tmp_path / "results"
    args = ["run", "--results-dir", str(results), "-q", "--", str(SCRIPT)]
    args += ["--deepspeed", str(config), "--per_device_train_batch_size", "3"]
    buffers_before = shared_buffers()
    outcome = cli.invoke(app, [*args, "--faults", "z3_8=raise"])
    assert outcome.exit_code == 0, outcome.output
    assert not buffers_left(buffers_before)

    frame = load_results(results).set_index("name")
    assert frame.loc["z3_mbs8", "status"] == "error"
    assert frame.loc["z3_mbs8", "error"] == "RuntimeError: injected failure in the training loop"
    ok = frame[frame["status"] == "ok"]
    assert set(ok.index) == {"z0_mbs4", "z0_mbs8", "z3_mbs4"}
    pids, losses = {}, {}
    for name, row in ok.iterrows():
        output = (results / "exps" / str(name) / "rank1.out").read_text()
        assert f"loader_batch={row['micro_batch_size']}" in output
        assert row["flops"] > 0 and row["engine"] == "deepspeed"
        pids[name] = re.findall(r"pid=(\d+)", output)
        losses[name] = [float(v) for v in re.findall(r"loss=(\S+)", output)]
    # DeepSpeed's state is reset between experiments in the warm actors, not by new ones...
    assert len({pid for found in pids.values() for pid in found}) < len(ok)
    # ...and the reused process trains as the first did: stage 3 as stage 0, same data. Over
    # the steps both ran: a stage-3 step slower than the leader's by the loser margin ends its
    # window early (stopped_after_steps), on a busy machine after its first timed step.
    ran = min(len(losses["z3_mbs4"]), len(losses["z0_mbs4"]))
    assert ran >= 1
    assert losses["z3_mbs4"][:ran] == pytest.approx(losses["z0_mbs4"][:ran], rel=1e-4)
    command = (results / "cmd_optimal.txt").read_text()
    assert command.startswith("torchrun --standalone --nproc_per_node 2 ")


def test_the_leftovers_of_killed_deepspeed_processes_are_cleared_and_live_ones_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    old = time.time() - STALE_AGE_S - 60
    stale, held, fresh = (tmp_path / op / "lock" for op in ("fused_adam", "cpu_adam", "shm"))
    buffer = f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_test.invalid_1_"
    stale_buffer, mapped_buffer = Path(buffer + "0"), Path(buffer + "1")
    for path in (stale, held, fresh):
        path.parent.mkdir()
    for path in (stale, held, fresh, stale_buffer, mapped_buffer):
        path.write_bytes(b"\0" * 4096)
    for path in (stale, held, stale_buffer, mapped_buffer):
        os.utime(path, (old, old))
    try:
        # A build in progress keeps its lock open; a live rank maps its buffer.
        with held.open(), mapped_buffer.open("r+b") as file, mmap.mmap(file.fileno(), 0):
            removed = clear_leftovers()
        assert {str(stale), str(stale_buffer)} <= set(removed)  # and any real ones
        assert held.exists() and fresh.exists() and mapped_buffer.exists()
    finally:
        for path in (stale_buffer, mapped_buffer):
            path.unlink(missing_ok=True)


def _built(folder: Path, op: str, *installation: str) -> None:
    """An op built in ``folder`` by the installation whose folders its commands name."""
    (folder / op).mkdir(parents=True)
    flags = " ".join(f"-I{path}/include" for path in installation)
    (folder / op / "build.ninja").write_text(f"cflags = {flags}\n")


@needs_deepspeed
def test_deepspeed_builds_its_ops_where_deepspeed_run_directly_does_unless_another_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    import torch.utils.cpp_extension

    from autotune.runner.deepspeed_engine import extensions_dir, own_extensions_dir

    monkeypatch.setattr(torch.utils.cpp_extension, "get_default_build_root", lambda: str(tmp_path))
    ours = (
        os.path.dirname(importlib.util.find_spec("deepspeed").origin),
        os.path.dirname(torch.__file__),
    )  # type: ignore[union-attr, arg-type]
    own = Path(own_extensions_dir())
    # Not PyTorch's shared folder (py311_cpu) by name: one per installation.
    assert re.fullmatch(r"py\d+_(cpu|cu\d+)_deepspeed_[0-9a-f]{12}", own.name)
    assert own.parent == tmp_path and own_extensions_dir() == str(own)
    # A fresh machine: PyTorch's default folder, shared with DeepSpeed run directly (its
    # launcher, its autotuner), so that each op is built once, not once for each.
    shared = Path(extensions_dir())
    assert shared.parent == tmp_path and shared != own and re.fullmatch(r"py\d+_\w+", shared.name)
    _built(shared, "fused_adam", *ours)
    assert extensions_dir() == str(shared)  # built there by this installation: reused
    # Another environment's build there would be rebuilt, and rebuilt back by it: own folder.
    _built(shared, "deepspeed_shm_comm", "/elsewhere/venv/deepspeed", ours[1])
    assert extensions_dir() == str(own)


@needs_deepspeed
def test_a_folder_of_its_own_that_holds_builds_is_kept_while_the_default_holds_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    import torch.utils.cpp_extension

    from autotune.runner.deepspeed_engine import extensions_dir, own_extensions_dir

    monkeypatch.setattr(torch.utils.cpp_extension, "get_default_build_root", lambda: str(tmp_path))
    _built(Path(own_extensions_dir()), "fused_adam", "/any")
    assert extensions_dir() == own_extensions_dir()


def test_ops_are_built_by_the_environments_ninja_however_the_run_was_started(
    tmp_path: Path,
) -> None:
    def executable(folder: Path) -> Path:
        folder.mkdir()
        tool = folder / "ninja"
        tool.write_text("#!/bin/sh\n")
        tool.chmod(0o755)
        return folder

    scripts, system = executable(tmp_path / "venv-bin"), executable(tmp_path / "usr-bin")
    first = deepspeed_engine.environment_ninja_first
    # Not activated: the system's ninja would build, taking the environment's builds for
    # changed commands (another version's hash) and rebuilding every op.
    assert first(f"{system}:/bin", str(scripts)) == f"{scripts}:{system}:/bin"
    assert first("", str(scripts)) == str(scripts)
    # Activated (or its ninja found first anyway): PATH as it was.
    assert first(f"{scripts}:{system}", str(scripts)) == f"{scripts}:{system}"
    # An environment without a ninja of its own (torch finds one on PATH, or says so): unchanged.
    assert first(f"{system}:/bin", str(tmp_path / "no-ninja")) == f"{system}:/bin"


@needs_deepspeed
def test_a_rank_loading_deepspeed_unactivated_finds_the_environments_ninja(
    tmp_path: Path,
) -> None:
    ninja = Path(sysconfig.get_path("scripts")) / "ninja"
    if not os.access(ninja, os.X_OK):
        pytest.skip("this environment has no ninja of its own")
    code = (
        "import shutil\n"
        "from autotune.runner import deepspeed_engine\n"
        "deepspeed_engine.load(2)\n"
        "print(shutil.which('ninja'))\n"
    )
    # As a rank of a run started without the environment activated: its bin not on PATH.
    env = {**os.environ, "PATH": "/usr/bin:/bin", deepspeed_engine.EXTENSIONS_ENV: str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert os.path.realpath(done.stdout.strip().splitlines()[-1]) == os.path.realpath(ninja)


def test_the_cpus_description_is_asked_once_a_boot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys
    import types

    asked = []
    fake = types.ModuleType("cpuinfo")

    def get_cpu_info() -> dict[str, Any]:
        asked.append(1)
        return {"flags": ["avx2"], "arch_string_raw": "x86_64"}

    fake.get_cpu_info = get_cpu_info  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cpuinfo", fake)
    monkeypatch.setenv(deepspeed_engine.EXTENSIONS_ENV, str(tmp_path))
    for _process in range(2):  # the second as a new process: only the file remains
        monkeypatch.setattr(deepspeed_engine, "_cpu_info_remembered", False)
        fake.get_cpu_info = get_cpu_info  # type: ignore[attr-defined]
        deepspeed_engine._remember_cpu_info()
        for _ in range(2):  # as an op build asks: twice
            assert fake.get_cpu_info()["flags"] == ["avx2"]
    on_linux = os.path.exists("/proc/sys/kernel/random/boot_id")  # else: one ask a process
    assert len(asked) == (1 if on_linux else 2)
    assert len(list(tmp_path.glob("cpuinfo-*.json"))) == (1 if on_linux else 0)
