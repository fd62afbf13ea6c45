"""What an experiment is and what it produced: plain, frozen, JSON-ready records.

An experiment = (a concrete config, a workload, a world size) → an :class:`ExperimentResult`
with a :class:`Status`. Runners produce results, the tuner reads them, the results directory
stores them. Nothing here imports torch or Ray.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from autotune.config.autotuning import EngineName
from autotune.script_target import ScriptTarget

# An experiment's config in its folder, as the experiment's code reads it (config_read).
CONFIG_NAME = "ds_config.json"


class Status(str, enum.Enum):
    """How an experiment ended. Only ``ok`` results have metrics and rank."""

    ok = "ok"
    oom = "oom"
    error = "error"
    timeout = "timeout"


@dataclass(frozen=True)
class ExperimentSpec:
    """Everything a runner needs to run one experiment.

    Attributes:
        name: unique within a results directory; also the experiment's folder name.
        ds_config: the concrete DeepSpeed config (batch triad resolved, no search lists).
        workload: a built-in name (``gpt``) or ``package.module:function``; None when
            ``script`` is set (whatever was passed: the script is what runs).
        workload_args: keyword arguments for the workload factory (none with a script).
        world_size: number of ranks.
        start_profile_step: first optimizer step inside the timed window (1-based).
        end_profile_step: last optimizer step inside the timed window, inclusive.
        timeout_s: wall-clock limit for the whole experiment.
        seed: model initialisation seed (same on every rank); data uses ``seed + rank``.
        cpus_per_rank: torch threads per rank process.
        device_memory_bytes: per-rank memory budget (None: the device's own limit).
        flops_per_sample: training FLOPs per sample if already known (else counted once).
        script: script mode: the user's training script to run instead of a workload.
        output_dir: where each rank leaves its script's stdout and stderr (``rank0.out``,
            ``rank0.err``, ...): the experiment's folder in the results directory.
        client_config: script mode: the config file the script reads, in its place (the
            user's keys, ``"auto"`` kept where a client fills it, the experiment's values set;
            see :func:`autotune.config.overrides.as_client_reads`).
        engine: what measures it: autotune's built-in engine, or the installed DeepSpeed's
            own (:mod:`autotune.runner.measuring_engine`); its value in ``to_dict``.
        stop_above_step_s: multi-fidelity: the profile window ends after a timed step when
            even the fastest timed step so far took longer than this many seconds (the
            configuration cannot come within the tolerance of the leader). None: the whole
            window runs.
        repeat_of: a re-measurement's configuration: the experiment that measured it first
            (None: this is that experiment).
    """

    # What the job decides has no default here: a spec is made from a job
    # (autotune.job.experiment_spec), so the defaults live once, in the config and
    # autotune/defaults.py.
    name: str
    ds_config: Mapping[str, Any]
    workload: str | None
    workload_args: Mapping[str, Any]
    world_size: int
    start_profile_step: int
    end_profile_step: int
    timeout_s: float
    seed: int
    cpus_per_rank: int
    device_memory_bytes: int | None = None
    flops_per_sample: float | None = None
    script: ScriptTarget | None = None
    output_dir: str | None = None
    client_config: Mapping[str, Any] | None = None
    engine: EngineName = EngineName.builtin
    stop_above_step_s: float | None = None
    repeat_of: str | None = None

    def __post_init__(self) -> None:
        # A spec read back from JSON (from_dict) names its engine by value.
        object.__setattr__(self, "engine", EngineName(self.engine))
        if self.script is not None:
            # The record (spec.json) must say what ran: never a workload a script replaced.
            object.__setattr__(self, "workload", None)
            object.__setattr__(self, "workload_args", {})
        elif self.workload is None:
            raise ValueError("an experiment runs a workload or a script; neither was given")
        if not 1 <= self.start_profile_step <= self.end_profile_step:
            raise ValueError(
                f"profile window must satisfy 1 <= start ({self.start_profile_step}) <= "
                f"end ({self.end_profile_step})"
            )
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")

    @property
    def target(self) -> str:
        """What the experiment runs, as summaries name it: the workload, or the script
        (``train.py``, ``-m pkg.train``)."""
        return self.script.label if self.script is not None else str(self.workload)

    @property
    def window_steps(self) -> int:
        return self.end_profile_step - self.start_profile_step + 1

    @property
    def config_read(self) -> Mapping[str, Any]:
        """The config as the experiment's code reads it: the client's form in script mode."""
        return self.client_config if self.client_config is not None else self.ds_config

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ds_config"] = dict(self.ds_config)
        data["workload_args"] = dict(self.workload_args)
        data["engine"] = self.engine.value
        if self.client_config is not None:
            data["client_config"] = dict(self.client_config)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExperimentSpec:
        """The spec :meth:`to_dict` wrote (e.g. a results directory's ``spec.json``)."""
        values = dict(data)
        if values.get("script") is not None:
            values["script"] = ScriptTarget.from_dict(values["script"])
        return cls(**values)


@dataclass(frozen=True)
class Metrics:
    """Measured over the profile window, end to end, with ranks synchronised at each step.

    Same meaning as DeepSpeed's: ``latency`` seconds per optimizer step (lower is better);
    ``throughput`` global samples per second; ``flops`` floating-point operations per second
    per rank. ``step_times_s`` are the window's individual steps so noise stays visible.

    Script mode also measures the model's size (the tuner knows a workload's in advance):
    ``num_params``, ``param_bytes`` and ``activation_bytes_per_sample`` (see
    :meth:`autotune.profiling.model_info.ModelInfo.from_metrics`).

    ``oversubscription``: how far other processes oversubscribed the ranks' cores during the
    window (0: not at all; None: not measured); see :attr:`disturbed`.
    """

    latency: float
    throughput: float
    flops: float
    peak_memory_bytes: int
    step_times_s: tuple[float, ...]
    train_batch_size: int
    flops_per_step: float
    num_params: int | None = None
    param_bytes: int | None = None
    activation_bytes_per_sample: int | None = None
    oversubscription: float | None = None

    @property
    def disturbed(self) -> bool:
        """Whether other processes competed for the ranks' cores during the window (see
        :mod:`autotune.profiling.interference`): the measurement shows the machine, not the
        configuration."""
        from autotune.profiling.interference import is_disturbed

        return is_disturbed(self.oversubscription)

    @property
    def latency_spread(self) -> float:
        """(slowest − fastest) / median step: 0.1 means steps varied by 10%."""
        from autotune.profiling.window import window_stats

        return window_stats(self.step_times_s).spread

    @classmethod
    def from_window(
        cls,
        step_times_s: Sequence[float],
        train_batch_size: int,
        flops_per_step: float,
        peak_memory_bytes: int,
    ) -> Metrics:
        """Derive the metrics from the window's step times.

        ``throughput × latency = train_batch_size`` holds by construction.
        """
        if not step_times_s:
            raise ValueError("a profile window needs at least one step")
        latency = sum(step_times_s) / len(step_times_s)
        return cls(
            latency=latency,
            throughput=train_batch_size / latency,
            flops=flops_per_step / latency,
            peak_memory_bytes=peak_memory_bytes,
            step_times_s=tuple(step_times_s),
            train_batch_size=train_batch_size,
            flops_per_step=flops_per_step,
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["step_times_s"] = list(self.step_times_s)
        data["latency_spread"] = self.latency_spread
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Metrics:
        names = {f for f in cls.__dataclass_fields__}
        values = {k: v for k, v in data.items() if k in names}
        values["step_times_s"] = tuple(values.get("step_times_s", ()))
        return cls(**values)


@dataclass(frozen=True)
class Timings:
    """Where an experiment's wall time went, in seconds."""

    # Process group, workload, engine, FLOP count; on Ray, a new gang's start-up too.
    startup_s: float = 0.0
    warmup_s: float = 0.0
    window_s: float = 0.0
    # After the window: the metrics, the engine and process group torn down, memory released.
    teardown_s: float = 0.0
    total_s: float = 0.0  # as seen by the runner, launch to verdict

    @property
    def overhead_s(self) -> float:
        """Time not spent training: the runner's cost of the experiment."""
        return max(0.0, self.total_s - self.warmup_s - self.window_s)


@dataclass(frozen=True)
class ExperimentResult:
    """The outcome of one experiment. A failure is a result too, never an exception."""

    name: str
    status: Status
    metrics: Metrics | None = None
    error: str | None = None  # one line: "ValueError: boom"
    error_detail: str | None = None  # the last traceback lines of the first failing rank
    failed_rank: int | None = None
    started_at: str = ""  # ISO 8601, UTC
    timings: Timings = field(default_factory=Timings)
    node_ids: tuple[str, ...] = ()  # where each rank ran (hostname or Ray node id)
    # Script mode: the script ended (returned or exited 0) after this many optimizer steps,
    # before the profile window was complete.
    ended_after_steps: int | None = None
    samples_per_rank: int | None = None
    """Script mode: a rank's share of the script's data, in samples, where the micro-batch
    was more than it (so is every larger one; the script ran out of data at 0 steps)."""
    stopped_after_steps: int | None = None
    """autotune ended the window after this many timed steps: slower than
    ``stop_above_step_s`` (a loser, stopped early)."""
    infrastructure_retries: int = 0
    """How many times the runner ran the experiment again after a failure of the machinery,
    not of the configuration (a rendezvous port taken, a rank actor lost before the
    experiment began); when every attempt failed so, ``error`` starts with
    ``infrastructure:``."""

    @property
    def ok(self) -> bool:
        return self.status is Status.ok

    @property
    def ended_early(self) -> bool:
        """The script ended before its profile window did (too little data, or a step limit
        of its own): not a verdict on the config's speed or memory."""
        return self.ended_after_steps is not None

    @property
    def duration_s(self) -> float:
        return self.timings.total_s

    def with_timings(self, **changes: float) -> ExperimentResult:
        return replace(self, timings=replace(self.timings, **changes))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status.value,
            "metrics": self.metrics.to_dict() if self.metrics else None,
            "error": self.error,
            "error_detail": self.error_detail,
            "failed_rank": self.failed_rank,
            "started_at": self.started_at,
            "timings": asdict(self.timings),
            "node_ids": list(self.node_ids),
            "ended_after_steps": self.ended_after_steps,
            "samples_per_rank": self.samples_per_rank,
            "stopped_after_steps": self.stopped_after_steps,
            "infrastructure_retries": self.infrastructure_retries,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExperimentResult:
        metrics = data.get("metrics")
        return cls(
            name=data["name"],
            status=Status(data["status"]),
            metrics=Metrics.from_dict(metrics) if metrics else None,
            error=data.get("error"),
            error_detail=data.get("error_detail"),
            failed_rank=data.get("failed_rank"),
            started_at=data.get("started_at", ""),
            timings=Timings(**data.get("timings", {})),
            node_ids=tuple(data.get("node_ids", ())),
            ended_after_steps=data.get("ended_after_steps", _ended_after_steps(data)),
            samples_per_rank=data.get("samples_per_rank"),
            stopped_after_steps=data.get("stopped_after_steps"),
            infrastructure_retries=data.get("infrastructure_retries", 0),
        )


def _ended_after_steps(data: Mapping[str, Any]) -> int | None:
    """What a log line written before results carried ``ended_after_steps`` says of it."""
    match = re.match(
        r"ScriptFinishedEarly: the script finished after (\d+) ", str(data.get("error") or "")
    )
    return int(match.group(1)) if match else None


def wall_time_s(results: Iterable[ExperimentResult]) -> float:
    """The wall time ``results`` took together: experiments that ran side by side count once
    (the union of their intervals); one without a start time adds its duration."""
    from datetime import datetime

    intervals, loose_s = [], 0.0
    for result in results:
        try:
            start = datetime.fromisoformat(result.started_at).timestamp()
        except ValueError:
            loose_s += result.duration_s
            continue
        intervals.append((start, start + result.duration_s))
    total_s, covered_until = loose_s, float("-inf")
    for start, end in sorted(intervals):
        total_s += max(0.0, end - max(start, covered_until))
        covered_until = max(covered_until, end)
    return total_s
