"""One experiment end to end on spawned local processes: metrics and every status."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from autotune.config import ConfigError
from autotune.experiment import ExperimentResult, Status
from autotune.runner import InProcessRunner, LocalRunner, local, run_local
from autotune.runner.local import check_local_gpus
from autotune.workloads import resolve_workload
from tests.cli_process import alive, wait_until
from tests.runner.specs import FAULTY, spec

pytestmark = pytest.mark.multirank


# spec's experiment on one rank, where the point is not between ranks.
ONE_RANK = {
    "train_batch_size": 4,
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "zero_optimization": {"stage": 2},
}
# A gpt just big enough that its FLOPs are those of its non-embedding weights (6 N tokens).
FLOPS_GPT = {"n_layer": 2, "d_model": 128, "n_head": 4, "seq_len": 64, "vocab": 512}


@pytest.fixture(scope="module")
def ok_result() -> ExperimentResult:
    """One good experiment whose different facts the next tests check (its ranks' start-up,
    two fresh interpreters importing torch, is most of an experiment's time here)."""
    return run_local(spec("ok", args=FLOPS_GPT))


def test_ok_experiment_has_consistent_metrics(ok_result: ExperimentResult) -> None:
    result = ok_result
    assert result.status is Status.ok, result.error_detail
    metrics = result.metrics
    assert metrics is not None
    assert len(metrics.step_times_s) == 3
    assert metrics.throughput * metrics.latency == pytest.approx(8)
    assert metrics.peak_memory_bytes > 0
    assert metrics.flops == pytest.approx(metrics.flops_per_step / metrics.latency)
    timings = result.timings
    assert timings.window_s > 0 and timings.warmup_s > 0 and timings.startup_s > 0
    assert timings.teardown_s > 0
    measured = timings.startup_s + timings.warmup_s + timings.window_s + timings.teardown_s
    assert timings.total_s >= measured
    assert len(result.node_ids) == 2


def test_flops_match_six_n_tokens_for_gpt(ok_result: ExperimentResult) -> None:
    result = ok_result
    assert result.metrics is not None, result.error
    model = resolve_workload("gpt", FLOPS_GPT).model
    embedding = sum(p.numel() for n, p in model.named_parameters() if "wte" in n or "wpe" in n)
    non_embedding = sum(p.numel() for p in model.parameters()) - embedding
    tokens_per_step_per_rank = 2 * 2 * 64  # micro-batch x accumulation x seq_len
    expected = 6 * non_embedding * tokens_per_step_per_rank
    assert result.metrics.flops_per_step == pytest.approx(expected, rel=0.10)


def test_an_exception_on_one_rank_is_status_error_with_its_traceback() -> None:
    result = run_local(spec("raise", FAULTY, {"fault": "raise", "rank_to_fail": 1}))
    assert result.status is Status.error
    assert result.error == "ValueError: deliberate failure on rank 1"
    assert result.failed_rank == 1
    assert result.error_detail is not None and "faulty_workloads.py" in result.error_detail


def test_exceeding_the_memory_budget_is_status_oom() -> None:
    result = run_local(spec("oom", device_memory_bytes=1 << 20, world_size=1, ds_config=ONE_RANK))
    assert result.status is Status.oom, result.error
    assert result.error is not None


@pytest.mark.slow
def test_a_hang_is_cut_by_the_timeout() -> None:
    # The timeout is paid in full: short, the ranks' start-up included.
    result = run_local(spec("hang", FAULTY, {"fault": "sleep", "rank_to_fail": 0}, timeout_s=6))
    # The runner's own SIGKILL of the hung ranks is not mistaken for the OOM killer's.
    assert result.status is Status.timeout, result.error
    assert result.error is not None and result.error.startswith("timeout: no verdict within 6 s")
    assert result.timings.total_s >= 6  # cut by the timeout, not before it


def test_a_rank_killed_by_sigkill_is_status_oom_blaming_the_oom_killer() -> None:
    result = run_local(spec("kill", FAULTY, {"fault": "kill", "rank_to_fail": 1}))
    assert result.status is Status.oom, result.error
    assert result.failed_rank == 1
    assert result.error == (
        "RankDied: rank 1 process ended without a report "
        "(killed by SIGKILL, most likely the kernel's OOM killer)"
    )


def test_a_rank_that_dies_of_another_signal_is_status_error_naming_it() -> None:
    args = {"fault": "kill", "rank_to_fail": 1, "signal": "SIGTERM"}
    result = run_local(spec("term", FAULTY, args))
    assert result.status is Status.error
    assert result.failed_rank == 1
    assert result.error is not None and "killed by SIGTERM" in result.error


def test_user_workload_from_a_module_in_a_temporary_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_models.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn

            def build(width=16):
                model = nn.Sequential(nn.Linear(8, width), nn.GELU(), nn.Linear(width, 1))

                class Loss(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.net = model

                    def forward(self, x, y):
                        return nn.functional.mse_loss(self.net(x), y)

                def make_batch(micro_batch_size, generator):
                    x = torch.randn(micro_batch_size, 8, generator=generator)
                    return x, x.sum(dim=1, keepdim=True)

                return Loss(), make_batch
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    # One rank: a spawned process finds the module as well as two do.
    result = run_local(
        spec("user", "my_models:build", {"width": 32}, world_size=1, ds_config=ONE_RANK)
    )
    assert result.status is Status.ok, result.error_detail


def test_more_local_ranks_than_gpus_is_refused_before_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two NCCL ranks on one GPU fail every experiment: said once, as a config error.
    monkeypatch.setattr(local, "visible_gpus", lambda: 1)
    with pytest.raises(ConfigError, match=r"2 local ranks need 2 GPUs .* this machine has 1"):
        LocalRunner().run(spec("two_on_one_gpu"))
    check_local_gpus(2, 0)  # no GPU: CPU ranks, any number
    check_local_gpus(2, 2)


def test_the_in_process_runner_measures_one_rank_here_and_an_oom_leaves_it_usable() -> None:
    config = {
        "train_batch_size": 4,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 3},
    }
    runner = InProcessRunner()
    oom = runner.run(spec("oom", ds_config=config, world_size=1, device_memory_bytes=1 << 20))
    assert oom.status is Status.oom, oom.error
    result = runner.run(spec("warm", ds_config=config, world_size=1))
    assert result.status is Status.ok, result.error_detail
    assert result.metrics is not None and len(result.metrics.step_times_s) == 3
    assert result.timings.total_s >= result.timings.window_s > 0
    with pytest.raises(ConfigError, match="world_size"):
        runner.run(spec("two", world_size=2))


def test_the_experiments_config_switches_the_workloads_checkpointing_on() -> None:
    config = {
        "train_batch_size": 4,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 1},
        "activation_checkpointing": {"enabled": True},
    }
    runner = InProcessRunner()
    plain = runner.run(
        spec("plain", ds_config={**config, "activation_checkpointing": {}}, world_size=1)
    )
    checkpointed = runner.run(spec("ckpt", ds_config=config, world_size=1))
    assert plain.status is checkpointed.status is Status.ok, checkpointed.error_detail
    assert plain.metrics is not None and checkpointed.metrics is not None
    # The recompute: the blocks' forward again.
    assert checkpointed.metrics.flops_per_step > 1.1 * plain.metrics.flops_per_step
    unable = runner.run(spec("mlp", "mlp", {}, ds_config=config, world_size=1))
    assert unable.status is Status.error and "checkpointing" in (unable.error or "")


def test_a_rank_may_start_processes_of_its_own() -> None:
    """A script's data loader starts worker processes in its rank: a rank process must not
    be one that multiprocessing forbids children (a daemon)."""
    workload = "tests.runner.faulty_workloads:with_loader_workers"
    result = run_local(spec("workers", workload, {}, world_size=1, ds_config=ONE_RANK))
    assert result.status is Status.ok, result.error


def test_ctrl_c_as_ranks_start_waits_for_every_start_then_stops_them_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rank the forkserver has forked is the driver's to stop only once its start has
    returned its pid: cut in between, it ran on unseen (holding the terminal's output)."""
    context = local._rank_context(local.rank_start_method(local.visible_gpus()))
    process_type = context.Process  # type: ignore[attr-defined]
    start = process_type.start
    started: list[Any] = []

    def ctrl_c_after_the_first(process: Any) -> None:
        start(process)
        started.append(process)
        if len(started) == 1:
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(process_type, "start", ctrl_c_after_the_first)
    with pytest.raises(KeyboardInterrupt):
        run_local(spec("interrupted"))
    assert len(started) == 2 and not any(process.is_alive() for process in started)


_KILLED_DRIVER = """
import sys
from autotune.runner import run_local
from tests.runner.specs import FAULTY, spec

hang = {"fault": "sleep", "rank_to_fail": 0, "pid_dir": sys.argv[1]}
run_local(spec("hang", FAULTY, hang, timeout_s=600))
"""


def test_a_driver_killed_with_sigkill_takes_its_ranks_with_it(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    driver = subprocess.Popen(
        [sys.executable, "-c", _KILLED_DRIVER, str(tmp_path)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        stderr=subprocess.DEVNULL,
    )
    pids: list[int] = []
    try:
        assert wait_until(lambda: len(list(tmp_path.glob("rank*"))) == 2, timeout_s=120)
        pids = [int(path.read_text()) for path in tmp_path.glob("rank*")]
        driver.kill()
        driver.wait()
        assert wait_until(lambda: not any(alive(pid) for pid in pids), timeout_s=20), (
            "a rank outlived its driver's kill -9"
        )
    finally:
        driver.kill()
        for pid in filter(alive, pids):
            os.kill(pid, signal.SIGKILL)
