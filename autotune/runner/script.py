"""Script mode, rank side: run the user's training script as one rank of an experiment.

The script runs in this (possibly warm) process through ``runpy``, as ``torchrun`` would run it:
``sys.argv`` set (with ``autotuning.arg_mappings`` applied), torchrun's environment variables
set, and ``import deepspeed`` resolving to the experiment's engine (autotune standing in, or
with ``autotuning.engine: deepspeed`` the installed DeepSpeed, watched; see
:meth:`autotune.runner.measuring_engine.MeasuringEngine.observing`). A
:class:`ScriptObserver` installed on the engine's hooks gives ``initialize()`` the experiment's
config, times the profile window at optimizer-step boundaries, counts one step's FLOPs, and then
ends the script's run by raising :class:`WindowDone` from inside ``engine.step()``.

Everything the script may change in the process is put back afterwards (environment, argv,
import path, working directory, stdout/stderr, logging handlers, the ``deepspeed`` alias);
the script's ``__main__`` namespace is dropped, while modules it imported stay cached so the
next experiment does not import them again; the worker processes of the script's data
loaders are stopped as its run ends. The caller (:func:`autotune.runner.rank.run_rank`) tears
down the process group the script made.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import runpy
import sys
import tempfile
import time
import traceback
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from autotune.config import overlay
from autotune.config.fields import AUTO
from autotune.config.keys import get_key
from autotune.experiment import CONFIG_NAME, ExperimentSpec, Metrics, Status
from autotune.profiling.interference import CpuSample, WindowCpu, sample_cpu
from autotune.profiling.window import StepTimer, ends_early
from autotune.runner.measuring_engine import measuring_engine
from autotune.runner.outcome import RankOutcome
from autotune.runner.process import torchrun_env
from autotune.script_target import ScriptTarget


class WindowDone(BaseException):
    """Raised from the engine's step hook once the profile window is measured, to end the
    script's run. A BaseException, so that a script's ``except Exception`` cannot swallow it."""


class ScriptFinishedEarly(RuntimeError):
    """The script returned (or exited 0) before the profile window was complete.

    ``ended_after_steps`` is the optimizer steps it had taken: the runner records it with the
    result, for the tuner to tell running out of data from a step limit of the script's own.
    """

    def __init__(self, message: str, steps: int) -> None:
        super().__init__(message)
        self.ended_after_steps = steps


class ScriptNeverInitialized(RuntimeError):
    """The script ended without building an engine: nothing of it can be tuned. Not a
    :class:`ScriptFinishedEarly`, since no micro-batch would change it."""


class ScriptExited(RuntimeError):
    """The script called ``sys.exit`` with a failure status."""


class MicroBatchMismatch(RuntimeError):
    """The script fed the engine micro-batches of another size than the experiment's: its
    data loader does not follow the config, so the experiment would measure another one."""


class ClientConfigMismatch(RuntimeError):
    """The script's client (the HF Trainer, Accelerate, Lightning, the script itself) built
    its engine with another ZeRO stage, micro-batch or accumulation than the experiment's: it
    configured itself from another config, so the experiment would measure a setup the client
    never saw (and the config it reports would not be the one that trains)."""


class MicroBatchOverData(ScriptFinishedEarly):
    """The experiment's micro-batch is more than a rank's share of the data
    (``samples_per_rank``): the client fills it by repeating samples (Accelerate's
    ``even_batches``). Counted as running out of data at every micro-batch over that share,
    so none of them is tried."""

    def __init__(self, message: str, samples_per_rank: int) -> None:
        super().__init__(message, 0)
        self.samples_per_rank = samples_per_rank


# What a client decides from its config before the engine is built, and so must agree with
# the experiment's: (config key, how the error names it).
CLIENT_VIEW = (
    ("zero_optimization.stage", "ZeRO stage"),
    ("train_micro_batch_size_per_gpu", "micro-batch"),
    ("gradient_accumulation_steps", "gradient accumulation"),
)


def client_mismatch(
    client: Mapping[str, Any], read: Mapping[str, Any], resolved: Mapping[str, Any]
) -> str | None:
    """What the config a client passed to ``initialize()`` (``client``, its ``"auto"`` values
    filled) says otherwise than the experiment, whose file says ``read`` and resolves to
    ``resolved``; None where they agree. A key the client leaves out or at ``"auto"``, or the
    experiment's file leaves at ``"auto"`` for the client to fill, is the client's to decide.

    Example:
        >>> experiment = {"zero_optimization": {"stage": 3}}
        >>> client_mismatch({"zero_optimization": {"stage": 2}}, experiment, experiment)
        'ZeRO stage 2 (zero_optimization.stage), where the experiment runs 3'
    """
    for key, name in CLIENT_VIEW:
        theirs, ours = get_key(client, key), get_key(resolved, key)
        if theirs in (None, AUTO) or ours in (None, AUTO) or get_key(read, key) == AUTO:
            continue
        if _number(theirs) != _number(ours):
            return f"{name} {theirs} ({key}), where the experiment runs {ours}"
    return None


def _number(value: Any) -> Any:
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def rank_share_of_data(world_size: int) -> tuple[int, int] | None:
    """``(samples, this rank's share)`` of the data loader the client iterates through
    Accelerate (its ``GradientState`` holds it), or None where none is known."""
    state = sys.modules.get("accelerate.state")
    gradient = getattr(state, "GradientState", None)
    if gradient is None or not getattr(gradient, "_shared_state", None):
        return None
    try:
        loaders = [loader for loader in gradient().dataloader_references if loader is not None]
        samples = int(loaders[-1].total_dataset_length) if loaders else None
    except (TypeError, AttributeError, NotImplementedError):  # an iterable dataset
        return None
    if samples is None:
        return None
    return samples, math.ceil(samples / world_size)


class ScriptObserver:
    """Steers and times the engine a script builds (see :mod:`autotune.engine.hooks`).

    FLOPs are counted over one whole optimizer step (forward and backward of every
    micro-batch) with ``FlopCounterMode``: step 1 when it is warm-up, else the step after the
    window, so counting never slows a timed step; and only while the job does not know them
    (``spec.flops_per_sample``, from the first experiment that measured the model): counting
    slows its step (measured on 2 cores: 0.4-0.9 s of every experiment's warm-up, and with
    the window from step 1 a whole step more after it). A window slower than
    ``spec.stop_above_step_s`` ends after the step that shows it, as the full window ends
    after its last step (see :func:`autotune.profiling.window.ends_early`).
    """

    def __init__(self, spec: ExperimentSpec, device: torch.device, started: float) -> None:
        self.spec = spec
        self.measuring = measuring_engine(spec.engine)
        self.device = device
        self.started = started
        self.engine: Any = None
        self.timer = StepTimer(sync=self._sync)
        start, end = spec.start_profile_step, spec.end_profile_step
        # Step 0 is never a step: known FLOPs are not counted again.
        counted = spec.flops_per_sample is None
        self.flop_step = 0 if not counted else 1 if start > 1 else end + 1
        self.last_step = max(end, self.flop_step)
        self.flops_per_step: float | None = None
        self._counter: Any = None
        self.startup_s = self.warmup_s = self.window_s = 0.0
        self._steps_started = 0.0
        self._held_at_window_bytes = 0
        self._cpu_before: CpuSample | None = None
        self._checked_micro_batch = False
        self.window_cpu: WindowCpu | None = None
        self.metrics: Metrics | None = None
        self.stopped_after_steps: int | None = None

    # --- EngineObserver -------------------------------------------------------------------

    def configure(self, config: Any) -> Any:
        """The experiment's config laid over the one the script passed (a dict, or None).

        The experiment's keys win; what only the script sets (its optimizer, scheduler,
        precision, clipping, as DeepSpeedExamples' cifar builds in a dict) is kept, so the
        experiment trains what the script trains rather than a bare config; and where the
        experiment's config says ``"auto"``, the value a client filled in (the HF Trainer, from
        its arguments) stands.
        """
        experiment = self.spec.config_read
        mismatch = client_mismatch(config, experiment, self.spec.ds_config) if config else None
        if mismatch is not None:
            raise ClientConfigMismatch(
                f"the script's client built its engine with {mismatch}: it configured itself "
                "from another config than the experiment's (give the config through the "
                "argument autotune rewrites, or map the key onto the script's flag in "
                "autotuning.arg_mappings)"
            )
        candidate = overlay(config, experiment) if config else dict(self.spec.ds_config)
        kept = sorted(set(config or {}) - set(experiment) - {"autotuning"})
        if kept:
            print(f"autotune: kept from the script's own config: {', '.join(kept)}", flush=True)
        if self.spec.device_memory_bytes is not None and self.measuring.enforces_memory_budget:
            candidate["device_memory_bytes"] = self.spec.device_memory_bytes
        return candidate

    def on_engine(self, engine: Any) -> None:
        self.engine = engine
        self._sync()
        self._steps_started = time.perf_counter()
        self.startup_s = self._steps_started - self.started
        if self.flop_step == 1:
            self._start_counting()
        if self.spec.start_profile_step == 1:
            self._start_window()

    def on_forward(self, engine: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Check once that the script feeds the experiment's micro-batch (the first dimension
        of its first tensor input)."""
        if self._checked_micro_batch:
            return
        self._checked_micro_batch = True
        expected = int(engine.train_micro_batch_size_per_gpu())
        data = rank_share_of_data(self.spec.world_size)
        if data is not None and expected > data[1]:
            raise MicroBatchOverData(
                f"micro-batch {expected} is more than a rank's share of the data ({data[1]} of "
                f"{data[0]} samples over {self.spec.world_size} ranks): the client would repeat "
                f"samples to fill it, so no micro-batch over {data[1]} is tried",
                data[1],
            )
        tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor) and v.dim()]
        if tensors and tensors[0].shape[0] != expected:
            raise MicroBatchMismatch(
                f"the script fed micro-batches of {tensors[0].shape[0]}, the experiment's is "
                f"{expected}: its data loader must follow train_micro_batch_size_per_gpu (map it "
                "onto the script's batch-size flag in autotuning.arg_mappings, e.g. "
                '{"train_micro_batch_size_per_gpu": "--per_device_train_batch_size"})'
            )

    def on_optimizer_step(self, engine: Any) -> None:
        step = engine.global_steps
        start, end = self.spec.start_profile_step, self.spec.end_profile_step
        if step == self.flop_step:
            self._stop_counting()
        if step == start - 1:
            self._start_window()
        elif start <= step <= end and self.stopped_after_steps is None:
            self.timer.lap()
            if ends_early(self.timer, self.spec.window_steps, self.spec.stop_above_step_s):
                self.stopped_after_steps = step - start + 1
                self._end_window_early(step)
            if step == end or self.stopped_after_steps is not None:
                self.window_s = self.timer.total_s
                self.window_cpu = WindowCpu.between(self._cpu_before, sample_cpu())
        if step == self.flop_step - 1 and step > 0:
            self._start_counting()
        if step >= self.last_step:
            self.metrics = self._measure(engine)
            raise WindowDone

    def _end_window_early(self, step: int) -> None:
        """The window ends at ``step``: the script's run ends there too, or one step later
        where the step after the window was to count the FLOPs (a window from step 1)."""
        if self.flop_step > step:
            self.flop_step = step + 1
        self.last_step = max(step, self.flop_step)

    # --- measuring ------------------------------------------------------------------------

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if dist.is_initialized():
            dist.barrier()

    def _start_window(self) -> None:
        self._cpu_before = sample_cpu()
        self.timer.start()
        self.warmup_s = time.perf_counter() - self._steps_started
        self._held_at_window_bytes = self._held_bytes()

    def _start_counting(self) -> None:
        from torch.utils.flop_counter import FlopCounterMode

        self._counter = FlopCounterMode(display=False)
        self._counter.__enter__()

    def _stop_counting(self) -> None:
        if self._counter is not None:
            self._counter.__exit__(None, None, None)
            self.flops_per_step = float(self._counter.get_total_flops())
            self._counter = None

    def close(self) -> None:
        """Leave no counting mode on the dispatch stack and no engine alive."""
        self._stop_counting()
        self.engine = None

    def _held_bytes(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.memory_allocated(self.device))
        return self.measuring.cpu_held_bytes(self.engine)

    def _measure(self, engine: Any) -> Metrics:
        micro = int(engine.train_micro_batch_size_per_gpu())
        peak = self.measuring.peak_memory_bytes(engine, self.device)
        activations = self.measuring.activation_bytes(engine, self.device)
        if activations is None:
            # No accounting of kinds: what the window added on top of what was held.
            activations = max(0, peak - self._held_at_window_bytes)
        params = list({id(p): p for p in engine.module.parameters()}.values())
        train_batch_size = int(engine.train_batch_size())
        flops_per_step = self.flops_per_step
        if flops_per_step is None and self.spec.flops_per_sample is not None:
            flops_per_step = self.spec.flops_per_sample * train_batch_size / self.spec.world_size
        metrics = Metrics.from_window(
            self.timer.durations_s,
            train_batch_size=train_batch_size,
            flops_per_step=flops_per_step or 0.0,
            peak_memory_bytes=peak,
        )
        return replace(
            metrics,
            num_params=sum(p.numel() for p in params),
            param_bytes=sum(p.numel() * p.element_size() for p in params),
            activation_bytes_per_sample=activations // max(micro, 1),
        )

    def early_finish(self) -> ScriptFinishedEarly | ScriptNeverInitialized:
        if self.engine is None and self._steps_started == 0.0:
            return ScriptNeverInitialized(
                "the script finished without calling deepspeed.initialize(): nothing to profile"
            )
        steps = self.engine.global_steps if self.engine is not None else 0
        return ScriptFinishedEarly(
            f"the script finished after {steps} optimizer steps, before end_profile_step "
            f"({self.last_step} steps are needed); give it more data or steps, or lower "
            "autotuning.end_profile_step",
            steps,
        )


def run_script(
    spec: ExperimentSpec, rank: int, init_method: str, device: torch.device, started: float
) -> RankOutcome:
    """Run ``spec.script`` as rank ``rank`` until its profile window is measured.

    Raises whatever the script raised (the caller turns it into a failed outcome); a script
    that ends before the window raises :class:`ScriptFinishedEarly`.
    """
    script = spec.script
    assert script is not None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    observer = ScriptObserver(spec, device, started)
    config_file = _config_file(spec, rank)
    argv = script.argv(spec.ds_config, config_file)
    launched = script.environment(config_file, spec.world_size)  # accelerate launch's
    try:
        with (
            script_environment(spec, rank, init_method, device, launched),
            observer.measuring.observing(observer, spec),
            loader_workers_stopped(),
        ):
            try:
                _run(script, argv)
            except (WindowDone, SystemExit):
                raise
            except BaseException:
                traceback.print_exc()  # into rank<N>.err, as Python prints a script's death
                raise
    except WindowDone:
        pass
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            said = _last_stderr_line(spec.output_dir, rank)
            raise ScriptExited(
                f"the script exited with status {exit_.code}" + (f": {said}" if said else "")
            ) from None
        raise observer.early_finish() from None
    else:
        raise observer.early_finish()
    finally:
        observer.close()
    assert observer.metrics is not None
    return RankOutcome(
        rank=rank,
        status=Status.ok,
        metrics=observer.metrics.to_dict(),
        startup_s=observer.startup_s,
        warmup_s=observer.warmup_s,
        window_s=observer.window_s,
        window_cpu=observer.window_cpu.to_dict() if observer.window_cpu is not None else None,
        stopped_after_steps=observer.stopped_after_steps,
    )


def _config_file(spec: ExperimentSpec, rank: int) -> str | None:
    """The experiment's config as its script reads it, in a file of its own: the experiment
    folder's ``ds_config.json`` (written by the driver; written here too where the folder is
    not shared with this node), else a file in this process's temporary directory."""
    if spec.client_config is None:
        return None
    text = json.dumps(dict(spec.client_config), indent=2)
    folder = spec.output_dir or tempfile.gettempdir()
    path = os.path.join(folder, CONFIG_NAME if spec.output_dir else f"{spec.name}.{rank}.json")
    with contextlib.suppress(OSError), open(path) as existing:
        if existing.read() == text:
            return path
    os.makedirs(folder, exist_ok=True)
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "w") as file:
        file.write(text)
    os.replace(partial, path)  # ranks writing the same file: each write is whole
    return path


def _last_stderr_line(output_dir: str | None, rank: int) -> str:
    """What the script last said on stderr before exiting (argparse's ``error: ...`` line,
    say), so the recorded error names the cause without opening the log."""
    if output_dir is None:
        return ""
    try:
        with open(os.path.join(output_dir, f"rank{rank}.err"), errors="replace") as err:
            lines = [line.strip() for line in err.readlines()[-20:] if line.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def _run(script: ScriptTarget, argv: list[str]) -> None:
    sys.argv = list(argv)
    if script.module is not None:
        sys.path.insert(0, os.getcwd())  # as ``python -m`` does
        runpy.run_module(script.module, run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, os.path.dirname(script.path))  # as ``python train.py`` does
        runpy.run_path(script.path, run_name="__main__")


@contextlib.contextmanager
def script_environment(
    spec: ExperimentSpec,
    rank: int,
    init_method: str,
    device: torch.device,
    launched: Mapping[str, str] | None = None,
) -> Iterator[None]:
    """This process as ``torchrun`` would start the script (with what its launcher sets,
    ``launched``), restored on exit."""
    saved_env = dict(os.environ)
    saved_argv, saved_path, saved_cwd = list(sys.argv), list(sys.path), os.getcwd()
    saved_handlers = list(logging.root.handlers)
    try:
        os.environ.update(launched or {})
        os.environ.update(torchrun_env(spec.world_size, rank, init_method, device))
        with _captured_output(spec.output_dir, rank):
            yield
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv[:] = saved_argv
        sys.path[:] = saved_path
        with contextlib.suppress(OSError):
            os.chdir(saved_cwd)
        for handler in [h for h in logging.root.handlers if h not in saved_handlers]:
            logging.root.removeHandler(handler)


@contextlib.contextmanager
def loader_workers_stopped() -> Iterator[None]:
    """On leaving the block, stop the worker processes of every data loader iterated inside.

    A loader's iterator stops its workers when it is freed. A script ended inside its loop
    (:class:`WindowDone`) leaves that to the garbage collector wherever the loader sits in a
    reference cycle (DeepSpeed's engine holds the loader ``initialize(training_data=...)``
    built, and the engine is in cycles): the collector first runs the finalizers that close
    the iterator's queues, so the iterator's own stop can no longer tell its workers to exit,
    and it waits torch's 5 s for each worker before killing it. Measured: 10 s after the
    window of every experiment of a DeepSpeedExamples-shaped script on DeepSpeed (its loader
    has two workers a rank). Stopped here, while the queues work, they exit at once.
    """
    from torch.utils.data import dataloader

    iterator_class: Any = dataloader._MultiProcessingDataLoaderIter
    iterated: weakref.WeakSet[Any] = weakref.WeakSet()
    original_init = iterator_class.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        iterated.add(self)

    iterator_class.__init__ = init
    try:
        yield
    finally:
        iterator_class.__init__ = original_init
        for iterator in list(iterated):
            with contextlib.suppress(Exception):  # already stopped, or broken: its own problem
                iterator._shutdown_workers()


@contextlib.contextmanager
def _captured_output(output_dir: str | None, rank: int) -> Iterator[None]:
    """Send fds 1 and 2 (so the script's prints, C++ logs and child processes alike) to
    ``rank<N>.out`` / ``rank<N>.err`` in ``output_dir``; none given: leave them alone."""
    if output_dir is None:
        yield
        return
    os.makedirs(output_dir, exist_ok=True)
    streams: tuple[tuple[Any, int, str], ...] = ((sys.stdout, 1, "out"), (sys.stderr, 2, "err"))
    saved: list[tuple[Any, int, int, bool]] = []
    try:
        for stream, fd, suffix in streams:
            stream.flush()
            path = os.path.join(output_dir, f"rank{rank}.{suffix}")
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            saved.append((stream, fd, os.dup(fd), getattr(stream, "line_buffering", False)))
            os.dup2(target, fd)
            os.close(target)
            # Line-buffered, so what a hung script printed is on disk when it is killed.
            with contextlib.suppress(AttributeError, ValueError):
                stream.reconfigure(line_buffering=True)
        yield
    finally:
        for stream, fd, original, line_buffering in reversed(saved):
            with contextlib.suppress(ValueError, OSError):
                stream.flush()
            os.dup2(original, fd)
            os.close(original)
            with contextlib.suppress(AttributeError, ValueError):
                stream.reconfigure(line_buffering=line_buffering)
