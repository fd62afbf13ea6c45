"""What ``autotune plan`` assembles before the cost model predicts: the config at the planned
world size, the model's size measured on the meta device, the hardware, and the constants
(a datasheet's, or a finished run's).

Nothing here runs an experiment or allocates the model: a 70B model is planned on a laptop.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.config import ConfigError, load_config
from autotune.config.knobs import CHECKPOINTING_KEY
from autotune.config.sizes import format_size
from autotune.defaults import DEFAULT_CONFIG, DEFAULT_WORKLOAD
from autotune.tuner.cost_model import CostModel, Topology, prior_for
from autotune.tuner.hardware import CATALOG, CPU_RANK, Hardware, load_hardware
from autotune.tuner.plan import PlannedConfig, plan
from autotune.tuner.space import micro_batch_sizes

if TYPE_CHECKING:
    from autotune.profiling.model_info import ModelInfo

SUMMARY_NAME = "summary.json"
# GPUs a plan is for when neither the request nor a run says.
PLAN_WORLD_SIZE = 8


@dataclass(frozen=True)
class PlanRequest:
    """What to plan.

    Attributes:
        config: the DeepSpeed-style config (a dict, as read); None: the run's with
            ``from_dir``, else the built-in one.
        workload: a workload spec (``hf:gpt2``, ``package.module:function``, ``gpt``); None:
            the run's with ``from_dir``, else the built-in one.
        workload_args: its arguments (None: the run's, with ``from_dir`` and no workload).
        world_size: GPUs planned for (None: the run's with ``from_dir``, else 8).
        gpus_per_node: GPUs per node (default: the hardware's usual node).
        hardware: a catalog name or a JSON file (None: the run's, with ``from_dir``, its
            memory the run's budget).
        from_dir: a finished ``model_based`` run whose fitted constants to use, and whose
            workload, config, world size and memory budget to plan unless given.
    """

    config: Mapping[str, Any] | None = None
    workload: str | None = None
    workload_args: Mapping[str, Any] | None = None
    world_size: int | None = None
    gpus_per_node: int | None = None
    hardware: str | None = None
    from_dir: Path | None = None


@dataclass(frozen=True)
class Plan:
    """A plan and what it was made for, so that a person can tell what it predicts.

    Attributes:
        rows: the predicted ranking, best first (:func:`autotune.tuner.plan.plan`).
        hardware: the device planned for (its memory the run's budget, from a run).
        world_size: GPUs planned for.
        fitted: the constants a run fitted (None: the datasheet's).
        model: the model's size, activations and FLOPs.
        precision: what it trains in (``fp32``, ``fp16``, ``bf16``).
        workload: what was planned: a workload spec, or a run's script.
        sample: one sample's shape in words (``sequence length 128``), where known.
        micro_batch_cap: the largest micro-batch the config allows, where a configuration
            at it fits (memory did not end the sizes: the config did).
        cap_listed: whether the user listed the sizes (else the batch limits set the cap).
        origin: what came from a finished run (``--from``), in words; empty without one.
        unused_fit: why the constants a run fitted were not used, in words: they were fitted
            on other hardware than the plan's (a CPU run's on a GPU); empty where they were.
    """

    rows: list[PlannedConfig]
    hardware: Hardware
    world_size: int
    fitted: CostModel | None
    model: ModelInfo
    precision: str
    workload: str
    sample: str | None = None
    micro_batch_cap: int | None = None
    cap_listed: bool = False
    origin: str = ""
    unused_fit: str = ""


@dataclass(frozen=True)
class TunedRun:
    """What a finished run tuned, from its results directory's ``fingerprint.json``.

    Attributes:
        path: the results directory.
        workload: its workload spec (None: it tuned a script).
        workload_args: the workload's arguments.
        script: the script's label (``train.py``), where it tuned one.
        world_size: its ranks.
        device_memory_bytes: its per-rank memory budget (None: not recorded).
        config: its config, with the ``autotuning`` section where the run recorded it.
    """

    path: Path
    workload: str | None
    workload_args: Mapping[str, Any]
    script: str | None
    world_size: int
    device_memory_bytes: int | None
    config: Mapping[str, Any]


def tuned_run(results_dir: Path) -> TunedRun:
    """What the run in ``results_dir`` tuned.

    Raises:
        ConfigError: no readable ``fingerprint.json`` there (not a run's directory).
    """
    from autotune.results.store import FINGERPRINT_NAME

    path = Path(results_dir) / FINGERPRINT_NAME
    try:
        stored = json.loads(path.read_text())
        tuned = stored["tuned"]
    except FileNotFoundError:
        raise ConfigError("--from", f"{path}: no such file (not a run's directory)") from None
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as err:
        raise ConfigError("--from", f"{path}: unreadable ({err})") from None
    config = dict(tuned.get("base_config") or {})
    if isinstance(stored.get("autotuning"), dict):  # recorded since the plan reads it
        config["autotuning"] = stored["autotuning"]
    elif config == _as_recorded(DEFAULT_CONFIG, int(tuned.get("world_size") or 1)):
        # A run recorded before: its config is the built-in one, autotuning section and all.
        config = dict(DEFAULT_CONFIG)
    script, label = tuned.get("script"), None
    if isinstance(script, dict):  # ScriptTarget.fingerprint's
        label = f"-m {script['module']}" if script.get("module") else Path(script["script"]).name
    return TunedRun(
        path=Path(results_dir),
        workload=tuned.get("workload"),
        workload_args=dict(tuned.get("workload_args") or {}),
        script=label,
        world_size=int(tuned.get("world_size") or 1),
        device_memory_bytes=tuned.get("device_memory_bytes"),
        config=config,
    )


def fitted_cost_model(results_dir: Path) -> CostModel:
    """The cost model a finished ``model_based`` run fitted (its ``summary.json``).

    Raises:
        ConfigError: no summary there, or one without a fitted model (another tuner type).
    """
    path = Path(results_dir) / SUMMARY_NAME
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError("--from", f"{path}: no such file (not a finished run)") from None
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError("--from", f"{path}: unreadable ({err})") from None
    model = data.get("cost_model") if isinstance(data, dict) else None
    if not model:
        raise ConfigError(
            "--from", f"{path}: no fitted cost model (the run's tuner was not model_based)"
        )
    try:
        return CostModel.from_dict(model)
    except ValueError as err:
        raise ConfigError("--from", f"{path}: {err}: run it again to plan from it") from None


def profile_cost_model(hardware: str) -> CostModel | None:
    """The cost model of a hardware profile ``autotune serve`` wrote (the constants fitted
    there last), where ``hardware`` names one; None for a catalog name or a plain file.

    Raises:
        ConfigError: the profile's model was fitted by an earlier version of the model.
    """
    path = Path(hardware)
    if path.suffix != ".json" or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None  # load_hardware says what is wrong with it
    if not isinstance(data, dict) or not isinstance(data.get("cost_model"), dict):
        return None
    try:
        return CostModel.from_dict(data["cost_model"])
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError("--hardware", f"{path}: {err}: the service fits it again") from None


def _as_recorded(raw: Mapping[str, Any], world_size: int) -> dict[str, Any]:
    """A config as a run's fingerprint records it (resolved, its autotuning section out)."""
    recorded = load_config(dict(raw), world_size=world_size).to_dict()
    recorded.pop("autotuning", None)
    return recorded


def make_plan(request: PlanRequest) -> Plan:
    """The predicted ranking for ``request``, and what it was made for.

    With ``from_dir``, what the request leaves out is the run's: its workload and arguments
    (or, for a script, the model its experiments measured), its config, its world size, and
    its memory budget on the hardware it was fitted on.

    Raises:
        ConfigError: a bad config, hardware, world size or results directory (names it).
        WorkloadError: the workload cannot be built or does not run on the meta device.
    """
    fitted = fitted_cost_model(request.from_dir) if request.from_dir is not None else None
    profiled = profile_cost_model(request.hardware) if request.hardware is not None else None
    fitted = fitted or profiled
    run = tuned_run(request.from_dir) if request.from_dir is not None else None
    hardware = _hardware(request.hardware, fitted)
    unused_fit = ""
    if fitted is not None and fitted.prior.hardware != hardware.name:
        # The constants are seconds and bytes per second of the device that measured them:
        # a CPU rank's 0.02 TFLOPS would make an H100 a CPU. The datasheet's stand instead.
        unused_fit = (
            f"the constants {request.from_dir} fitted are {fitted.prior.hardware}'s, not "
            f"{hardware.name}'s: planned with {hardware.name}'s datasheet instead"
        )
        fitted = None
    if run is not None and request.hardware is None and run.device_memory_bytes:
        # The run's budget is what fitted, there: a CPU rank's stands in for a GPU's memory.
        hardware = replace(hardware, memory_bytes=int(run.device_memory_bytes))
    world_size = request.world_size or (run.world_size if run is not None else PLAN_WORLD_SIZE)
    per_node = request.gpus_per_node or min(hardware.gpus_per_node, world_size)
    if per_node < 1:
        raise ConfigError("--gpus-per-node", f"must be at least 1 (got {per_node})")
    if world_size % per_node and world_size > per_node:
        raise ConfigError(
            "--world-size",
            f"{world_size} GPUs do not fill whole nodes of {per_node} "
            "(--gpus-per-node): use a multiple of it",
        )
    raw = request.config
    if raw is None:
        raw = run.config if run is not None else DEFAULT_CONFIG
    config = load_config(dict(raw), world_size=world_size)
    checkpointed = config.activation_checkpointing.enabled or bool(
        config.search_space.get(CHECKPOINTING_KEY)
    )
    workload, args = request.workload, request.workload_args
    if workload is None and run is not None:
        workload, args = run.workload, args if args is not None else run.workload_args
    sample = None
    if workload is None and run is not None:  # a script: the model its experiments measured
        info = _measured_model(run)
        what = f"script {run.script}"
    else:
        workload = workload or DEFAULT_WORKLOAD
        info, sample = _model_on_meta(workload, dict(args or {}), config.precision, checkpointed)
        what = _workload_words(workload, args or {})
    if hardware.name == CPU_RANK.name:
        # As a run on CPU ranks estimates: the engine's accounting, which its budget holds,
        # counts what is saved for backward, not the gradients in flight.
        info = replace(info, backward_bytes_per_sample=0)
    model = fitted
    if model is not None:
        data_parallel = max(1, config.world_size // config.autotuning.mp_size)
        topology = Topology(data_parallel, min(per_node, data_parallel), config.precision)
        if topology.spans_nodes:
            # A run on one node never measured the network: the datasheet's figure stands.
            model = model.with_prior_for(["network_bandwidth"], prior_for(hardware, topology))
    rows = plan(config, info, hardware, per_node, model)
    sizes, listed = micro_batch_sizes(config)
    capped = any(row.fits and row.micro_batch_size == sizes[-1] for row in rows)
    return Plan(
        rows=rows,
        hardware=hardware,
        world_size=world_size,
        fitted=fitted,
        model=info,
        precision=config.precision,
        workload=what,
        sample=sample,
        micro_batch_cap=sizes[-1] if capped else None,
        cap_listed=listed,
        origin=_origin_words(run, request, fitted is not None)
        if run is not None
        else (f"the constants fitted on it ({request.hardware})" if profiled else ""),
        unused_fit=unused_fit,
    )


def _model_on_meta(
    workload: str, args: dict[str, Any], precision: str, checkpointed: bool
) -> tuple[ModelInfo, str | None]:
    """The workload's model info, built on the meta device (its checkpointed activations
    measured too where the config asks for them), and one sample's shape in words."""
    import torch

    from autotune.profiling.model_info import model_info_on_meta
    from autotune.workloads import WorkloadError, resolve_workload

    try:
        with torch.device("meta"):
            built = resolve_workload(workload, args)
        if checkpointed and built.activation_checkpointing is None:
            raise WorkloadError(
                f"workload {workload!r}: cannot switch activation checkpointing on "
                f"(the config's {CHECKPOINTING_KEY}); a built-in gpt or an hf: workload can"
            )
        # Checkpointed activations are measured only where the config asks for them: a
        # 7B model's passes are most of a plan's time.
        switch = built.activation_checkpointing if checkpointed else None
        info = model_info_on_meta(built, precision, switch)
        inputs = built.make_batch(1, torch.Generator().manual_seed(0))
    except WorkloadError:
        raise
    except Exception as err:  # an op without a meta kernel, a tensor made on a fixed device
        raise WorkloadError(
            f"workload {workload!r}: planning builds it on the meta device, where it "
            f"failed ({type(err).__name__}: {err})"
        ) from None
    return info, _sample_words(inputs)


def _sample_words(inputs: Any) -> str | None:
    """One sample as a person reads it: token ids (a 1-by-L integer tensor) are a sequence
    of L; anything else its shape."""
    import torch

    first = next((x for x in inputs if isinstance(x, torch.Tensor)), None)
    if first is None or first.dim() < 2:
        return None
    if not first.is_floating_point() and first.dim() == 2:
        return f"sequence length {first.shape[1]}"
    return f"sample shape {tuple(first.shape[1:])}"


def _measured_model(run: TunedRun) -> ModelInfo:
    from autotune.job import measured_model_info
    from autotune.results import ResultsDir

    info = measured_model_info(ResultsDir(run.path).results(), run.world_size)
    if info is None:
        raise ConfigError(
            "--from",
            f"{run.path}: the run tuned {run.script}, and no experiment of it measured the "
            "model: give --workload",
        )
    return info


def _workload_words(workload: str, args: Mapping[str, Any]) -> str:
    """``workload mlp (d_hidden=512)``."""
    given = ", ".join(f"{key}={value}" for key, value in args.items())
    return f"workload {workload}" + (f" ({given})" if given else "")


def _origin_words(run: TunedRun, request: PlanRequest, fitted: bool) -> str:
    """What the plan took from the run, and what the request set instead (``fitted``: its
    constants too)."""
    taken = ["the constants it fitted"] if fitted else []
    if fitted and request.workload is not None and request.workload != run.workload:
        taken[0] += f" to {run.workload or run.script}, not to {request.workload}"
    if request.workload is None:
        taken.append("its " + ("script's model" if run.workload is None else "workload"))
    if request.config is None:
        taken.append("its config")
    if request.world_size is None:
        taken.append(f"its {run.world_size} ranks")
    if request.hardware is None and run.device_memory_bytes:
        taken.append(f"its memory budget of {format_size(run.device_memory_bytes)} per rank")
    return f"from {run.path}: " + (", ".join(taken) or "nothing (every input given)")


def _hardware(name: str | None, fitted: CostModel | None) -> Hardware:
    if name is not None:
        return load_hardware(name)
    if fitted is None:
        raise ConfigError("--hardware", "needed (a catalog name or a JSON file), or --from")
    measured_on = fitted.prior.hardware
    if measured_on == CPU_RANK.name:
        return CPU_RANK
    if measured_on in CATALOG:
        return CATALOG[measured_on]
    raise ConfigError("--hardware", f"needed: the run was fitted on {measured_on!r}")
