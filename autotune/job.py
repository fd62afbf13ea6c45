"""A tuning job: what to tune and where its results live, and what is known before it runs.

:class:`TuningJob` holds the job; :func:`check_job` checks it (and profiles a workload, with
:func:`~autotune.profiling.model_info.profile_workload`) before any experiment, and
:func:`experiment_spec` turns one of the tuner's candidates into the experiment a runner runs.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.config import Config, parse_size
from autotune.config.overrides import as_client_reads
from autotune.defaults import DEFAULT_CPU_DEVICE_MEMORY, DEFAULT_CPUS_PER_RANK, DEFAULT_WORKLOAD
from autotune.experiment import ExperimentResult, ExperimentSpec
from autotune.profiling.interference import CpuSample
from autotune.results import ResultsDir
from autotune.runner.measuring_engine import measuring_engine
from autotune.script_target import ScriptTarget
from autotune.tuner.candidate import Candidate
from autotune.tuner.hardware import Hardware, hardware_for_device

if TYPE_CHECKING:
    from autotune.profiling.model_info import ModelInfo


@dataclass(frozen=True)
class TuningJob:
    """What to tune and where to keep the results.

    Attributes:
        config: the user's config (search lists and ``autotuning`` section included); the
            world size, profile window, timeout and seed of every experiment are its.
        workload: a built-in workload name or ``package.module:function``.
        workload_args: the workload's keyword arguments.
        results_dir: where results live; the same directory resumes. None: the config's
            ``autotuning.results_dir``.
        device_memory_bytes: per-rank memory budget (None: the config's, else the device's).
        overwrite: discard a previous run's results in ``results_dir``.
        cpus_per_rank: cores (torch threads) each rank gets.
        script: script mode: the user's training script, run instead of ``workload``.
        started_s: the ``time.monotonic()`` reading ``autotuning.time_budget_s`` counts from
            (the CLI: the command's start, so the cluster's start-up counts); None: when
            :func:`tune` starts.
        started_cpu: the node's CPU accounting at the job's start, so that the run knows
            whether a neighbour was busy before its first experiment (see
            :func:`autotune.tuning.tune`); None: not known.
    """

    config: Config
    workload: str = DEFAULT_WORKLOAD
    workload_args: Mapping[str, Any] = field(default_factory=dict)
    results_dir: Path | None = None
    device_memory_bytes: int | None = None
    overwrite: bool = False
    cpus_per_rank: int = DEFAULT_CPUS_PER_RANK
    script: ScriptTarget | None = None
    started_s: float | None = None
    started_cpu: CpuSample | None = None

    @property
    def results_path(self) -> Path:
        """Where results live: ``results_dir``, else the config's ``autotuning.results_dir``."""
        if self.results_dir is not None:
            return Path(self.results_dir)
        return Path(self.config.autotuning.results_dir)

    @property
    def label(self) -> str:
        """What is tuned, for summaries: the workload, or the script."""
        return self.script.label if self.script is not None else self.workload

    @property
    def rank_cores(self) -> int:
        """The cores one experiment's ranks keep busy: a thread per core each."""
        return self.world_size * self.cpus_per_rank

    @property
    def world_size(self) -> int:
        return self.config.world_size

    @property
    def memory_budget(self) -> int | None:
        """The per-rank budget: the flag's, else the config's, else on a machine without a GPU:

        - an engine that enforces it (the built-in one): a default that stands in for a
          device, so the tuner meets out-of-memory boundaries instead of growing
          micro-batches until the host runs out of RAM.
        - one that does not (DeepSpeed): the host's RAM shared among the ranks. DeepSpeed's
          CPU peak is the whole process's resident set. Set against the stand-in, that
          peak (libraries included) made every size look over the limit. The search then
          climbed one micro-batch at a time.
        """
        budget = self.device_memory_bytes or self.config.device_memory_bytes
        if budget is None and not _has_cuda():
            if measuring_engine(self.config.autotuning.engine).enforces_memory_budget:
                budget = parse_size(DEFAULT_CPU_DEVICE_MEMORY)
            else:
                budget = _host_memory_bytes() // self.world_size
        return budget

    def fingerprint(self) -> dict[str, Any]:
        """What makes two runs the same job (``tuned``) and what merely ran it (``versions``).

        The ``autotuning`` section is left out of ``tuned``, except the profile window and the
        engine: raising ``tuner_num_trials`` or changing the metric continues a run, while
        changing how experiments are measured starts a different one.
        """
        import torch

        import autotune

        base = self.config.to_dict()
        tuning = base.pop("autotuning", {})
        window = {k: tuning[k] for k in ("start_profile_step", "end_profile_step") if k in tuning}
        # A script is the same job while its file, arguments and arg mappings are the same.
        target: dict[str, Any] = (
            {"script": self.script.fingerprint()}
            if self.script is not None
            else {"workload": self.workload, "workload_args": dict(self.workload_args)}
        )
        return {
            "tuned": {
                **target,
                "world_size": self.world_size,
                "device_memory_bytes": self.memory_budget,
                "base_config": base,
                "profile_window": window,
                "engine": self.config.autotuning.engine.value,
            },
            # Not what makes the job (resuming with more trials is the same job): what
            # `autotune plan --from` needs to plan its space (the micro-batch cap, the metric).
            "autotuning": tuning,
            "versions": {
                "autotune": autotune.__version__,
                "torch": torch.__version__,
                "python": platform.python_version(),
            },
        }


def check_job(job: TuningJob) -> ModelInfo | None:
    """What can be checked before anything starts (Ray takes seconds): the workload builds,
    runs a forward on the meta device and is profiled, and the results directory can hold
    this job. Returns the workload's profile (None for a script, whose model its first
    experiment measures): checked while Ray starts, it is ready when the first experiment is.

    Raises:
        WorkloadError: the workload spec or its arguments are unusable.
        ResultsDirError / ResultsLockedError: the results directory cannot be used.
        DeepSpeedUnavailable: the job measures on DeepSpeed, and none usable is installed.
    """
    measuring_engine(job.config.autotuning.engine).check_installed()
    if job.script is not None:
        info = None
    else:
        from autotune.profiling.model_info import profile_workload

        info = profile_workload(job.config, job.workload, job.workload_args)
    ResultsDir.check(job.results_path, job.fingerprint(), overwrite=job.overwrite)
    return info


def measured_model_info(history: list[ExperimentResult], world_size: int) -> ModelInfo | None:
    """The model's info from the first of ``history`` that measured it (script mode)."""
    from autotune.profiling.model_info import ModelInfo

    for result in history:
        info = ModelInfo.from_metrics(result.metrics, world_size)
        if info is not None:
            return info
    return None


def job_hardware() -> Hardware:
    """What the ranks run on, as the cost model's starting point: the catalog entry of this
    machine's GPU, or CPU ranks without one (a guess either way; the fit corrects it)."""
    import torch

    if not torch.cuda.is_available():
        return hardware_for_device(None)
    return hardware_for_device(torch.cuda.get_device_name())


def _host_memory_bytes() -> int:
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def experiment_spec(
    job: TuningJob,
    candidate: Candidate,
    flops_per_sample: float | None,
    output_dir: str | None = None,
) -> ExperimentSpec:
    tuning = job.config.autotuning
    client_config = None
    if job.script is not None:  # the file the script reads instead of its own
        client_config = as_client_reads(job.config.spec, candidate.overrides, candidate.ds_config)
    return ExperimentSpec(
        name=candidate.name,
        ds_config=dict(candidate.ds_config),
        workload=job.workload,
        workload_args=dict(job.workload_args),
        world_size=job.world_size,
        start_profile_step=tuning.start_profile_step,
        end_profile_step=tuning.end_profile_step,
        timeout_s=tuning.timeout_s,
        device_memory_bytes=job.memory_budget,
        seed=tuning.seed,
        flops_per_sample=flops_per_sample,
        cpus_per_rank=job.cpus_per_rank,
        script=job.script,
        output_dir=output_dir,
        client_config=client_config,
        engine=tuning.engine,
        stop_above_step_s=candidate.stop_above_step_s,
        repeat_of=candidate.repeat_of,
    )
