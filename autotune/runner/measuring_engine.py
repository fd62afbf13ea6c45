"""The engine that measures an experiment (``autotuning.engine``): one object per kind, which
the runner asks instead of branching on the engine's name.

Each answers what differs between autotune's built-in ZeRO engine and the installed DeepSpeed:
how summaries name it, what its rank processes need when they start, around an experiment and
after a failed one, how a rank builds it for a workload or watches the one a script builds,
and how its memory is read. Look one up with :func:`measuring_engine`.

Torch-free at import (the driver asks for labels and checks jobs before anything starts); the
engines themselves load inside the methods a rank calls. DeepSpeed's rank side is
:mod:`autotune.runner.deepspeed_engine`.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from autotune.config.autotuning import EngineName
from autotune.experiment import ExperimentSpec
from autotune.runner import deepspeed_engine
from autotune.runner.process import torchrun_env

if TYPE_CHECKING:  # the engine package imports torch; its hooks need none
    from autotune.engine.hooks import EngineObserver


class MeasuringEngine(Protocol):
    """What the runner asks of the engine that measures an experiment."""

    name: EngineName
    fresh_after_failure: bool
    """Its process state is reset after a clean experiment but not trusted after a failed
    one (a failure can leave anything half set up): the failed experiment's gang is then
    replaced rather than reused."""
    enforces_memory_budget: bool
    """It raises out-of-memory at ``device_memory_bytes`` on any device, so a script's
    config carries the experiment's budget."""

    @property
    def label(self) -> str:
        """How summaries name it."""
        ...

    def check_installed(self) -> None:
        """Raise before anything starts where this engine cannot run here.

        Raises:
            DeepSpeedUnavailable: it is DeepSpeed, and none usable is installed.
        """
        ...

    def launcher(self, world_size: int) -> list[str]:
        """The command that trains a script on it over ``world_size`` ranks, the script and
        its arguments to follow."""
        ...

    def training_hint(self, optimal_path: Path, world_size: int) -> str:
        """How to train with the best config (``optimal_path``) of a workload on it: the
        user's own training script, which autotune does not know."""
        ...

    def prepare(self, world_size: int) -> None:
        """Pay what the first experiment in a new rank process would, as the process starts."""
        ...

    def session(
        self, spec: ExperimentSpec, rank: int, init_method: str, device: Any
    ) -> contextlib.AbstractContextManager[None]:
        """What one experiment needs around it in this rank process, and this process left
        ready for the next (the caller tears down the process group)."""
        ...

    def initialize(self, model: Any, config: Mapping[str, Any], spec: ExperimentSpec) -> Any:
        """The engine training ``model`` under ``config``, in the process group this rank
        has already joined."""
        ...

    def observing(
        self, observer: EngineObserver, spec: ExperimentSpec
    ) -> contextlib.AbstractContextManager[None]:
        """Script mode: inside the block, the script's ``import deepspeed`` gives this engine,
        and each engine it builds reports to ``observer``."""
        ...

    def peak_memory_bytes(self, engine: Any, device: Any) -> int:
        """The most memory this rank held since ``engine`` was built."""
        ...

    def cpu_held_bytes(self, engine: Any) -> int:
        """What a CPU rank holds now (on CUDA the allocator says it, whatever the engine)."""
        ...

    def activation_bytes(self, engine: Any, device: Any) -> int | None:
        """The activations ``engine`` saved for backward at their peak, where it accounts
        them; None where it does not (the window's growth over what was held stands in)."""
        ...


class BuiltinMeasuringEngine:
    """autotune's own ZeRO engine (:mod:`autotune.engine`): it accounts every byte it holds on
    CPU, enforces the memory budget, and leaves nothing behind in a process."""

    name = EngineName.builtin
    fresh_after_failure = False
    enforces_memory_budget = True
    label = "autotune's built-in ZeRO engine"

    def check_installed(self) -> None:
        pass  # part of autotune

    def launcher(self, world_size: int) -> list[str]:
        return ["autotune", "exec", "--nproc", str(world_size), "--"]

    def training_hint(self, optimal_path: Path, world_size: int) -> str:
        example = shlex.join([*self.launcher(world_size), "train.py"])
        return (
            f"your DeepSpeed script with --deepspeed_config {optimal_path} (on the built-in "
            f"engine: {example} ...)"
        )

    def prepare(self, world_size: int) -> None:
        pass  # the rank process imports the engine before its process groups anyway

    def session(
        self, spec: ExperimentSpec, rank: int, init_method: str, device: Any
    ) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def initialize(self, model: Any, config: Mapping[str, Any], spec: ExperimentSpec) -> Any:
        import torch.distributed as dist

        from autotune.engine import initialize

        engine, _, _, _ = initialize(
            model=model,
            config=dict(config),
            process_group=dist.group.WORLD,
            device_memory_bytes=spec.device_memory_bytes,
        )
        return engine

    @contextlib.contextmanager
    def observing(self, observer: EngineObserver, spec: ExperimentSpec) -> Iterator[None]:
        from autotune.deepspeed.stand_in import standing_in
        from autotune.engine import hooks

        with standing_in(), hooks.observing(observer):
            yield

    def peak_memory_bytes(self, engine: Any, device: Any) -> int:
        return int(engine.peak_memory_bytes())

    def cpu_held_bytes(self, engine: Any) -> int:
        return int(engine.memory_tracker.accounted_bytes) if engine is not None else 0

    def activation_bytes(self, engine: Any, device: Any) -> int | None:
        if device.type == "cuda":  # the CUDA allocator counts them with everything else
            return None
        return int(engine.memory_tracker.peak_by_kind["activations"])


class DeepSpeedMeasuringEngine:
    """The installed DeepSpeed's own engine (:mod:`autotune.runner.deepspeed_engine`): loaded
    as a rank process starts, its process state reset after each experiment, its CPU memory
    the process's resident set (it accounts none and enforces no budget)."""

    name = EngineName.deepspeed
    fresh_after_failure = True
    enforces_memory_budget = False

    @property
    def label(self) -> str:
        try:
            return f"DeepSpeed {deepspeed_engine.installed_deepspeed()}"
        except deepspeed_engine.DeepSpeedUnavailable:
            return "DeepSpeed"

    def check_installed(self) -> None:
        deepspeed_engine.installed_deepspeed()

    def launcher(self, world_size: int) -> list[str]:
        # Plain torchrun: the script's ``import deepspeed`` is the installed one.
        return ["torchrun", "--standalone", "--nproc_per_node", str(world_size)]

    def training_hint(self, optimal_path: Path, world_size: int) -> str:
        return f"deepspeed train.py --deepspeed_config {optimal_path} (the engine that measured it)"

    def prepare(self, world_size: int) -> None:
        deepspeed_engine.prepare(world_size)

    def session(
        self, spec: ExperimentSpec, rank: int, init_method: str, device: Any
    ) -> contextlib.AbstractContextManager[None]:
        # DeepSpeed reads its rank and node from torchrun's variables.
        return deepspeed_engine.session(torchrun_env(spec.world_size, rank, init_method, device))

    def initialize(self, model: Any, config: Mapping[str, Any], spec: ExperimentSpec) -> Any:
        return deepspeed_engine.initialize(model, config, spec.world_size)

    def observing(
        self, observer: EngineObserver, spec: ExperimentSpec
    ) -> contextlib.AbstractContextManager[None]:
        return deepspeed_engine.observing(observer, spec.world_size)

    def peak_memory_bytes(self, engine: Any, device: Any) -> int:
        return deepspeed_engine.peak_memory_bytes(device)

    def cpu_held_bytes(self, engine: Any) -> int:
        return deepspeed_engine.resident_bytes()

    def activation_bytes(self, engine: Any, device: Any) -> int | None:
        return None


_ENGINES: dict[EngineName, MeasuringEngine] = {
    EngineName.builtin: BuiltinMeasuringEngine(),
    EngineName.deepspeed: DeepSpeedMeasuringEngine(),
}


def measuring_engine(name: EngineName) -> MeasuringEngine:
    """The engine that ``autotuning.engine`` names."""
    return _ENGINES[name]
