"""What ``autotune plan`` assembles before the cost model predicts: the config at the planned
world size, the model's size measured on the meta device, the hardware, and the constants
(a datasheet's, or a finished run's).

Nothing here runs an experiment or allocates the model: a 70B model is planned on a laptop.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.config import ConfigError, load_config
from autotune.config.knobs import CHECKPOINTING_KEY
from autotune.tuner.cost_model import CostModel, Topology, prior_for
from autotune.tuner.hardware import CATALOG, CPU_RANK, Hardware, load_hardware
from autotune.tuner.plan import PlannedConfig, plan

SUMMARY_NAME = "summary.json"


@dataclass(frozen=True)
class PlanRequest:
    """What to plan.

    Attributes:
        config: the DeepSpeed-style config (a dict, as read).
        workload: a workload spec (``hf:gpt2``, ``package.module:function``, ``gpt``).
        workload_args: its arguments.
        world_size: GPUs planned for.
        gpus_per_node: GPUs per node (default: the hardware's usual node).
        hardware: a catalog name or a JSON file (None: the run's, with ``from_dir``).
        from_dir: a finished ``model_based`` run whose fitted constants to use.
    """

    config: Mapping[str, Any]
    workload: str
    workload_args: Mapping[str, Any] = field(default_factory=dict)
    world_size: int = 8
    gpus_per_node: int | None = None
    hardware: str | None = None
    from_dir: Path | None = None


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


def make_plan(request: PlanRequest) -> tuple[list[PlannedConfig], Hardware, CostModel | None]:
    """The predicted ranking for ``request``, the hardware it was made for, and the fitted
    model used (None: the datasheet's).

    Raises:
        ConfigError: a bad config, hardware, world size or results directory (names it).
        WorkloadError: the workload cannot be built or does not run on the meta device.
    """
    import torch

    from autotune.profiling.model_info import model_info_on_meta
    from autotune.workloads import WorkloadError, resolve_workload

    fitted = fitted_cost_model(request.from_dir) if request.from_dir is not None else None
    hardware = _hardware(request.hardware, fitted)
    per_node = request.gpus_per_node or min(hardware.gpus_per_node, request.world_size)
    if per_node < 1:
        raise ConfigError("--gpus-per-node", f"must be at least 1 (got {per_node})")
    if request.world_size % per_node and request.world_size > per_node:
        raise ConfigError(
            "--world-size",
            f"{request.world_size} GPUs do not fill whole nodes of {per_node} "
            "(--gpus-per-node): use a multiple of it",
        )
    config = load_config(dict(request.config), world_size=request.world_size)
    checkpointed = config.activation_checkpointing.enabled or bool(
        config.search_space.get(CHECKPOINTING_KEY)
    )
    try:
        with torch.device("meta"):
            workload = resolve_workload(request.workload, dict(request.workload_args))
        if checkpointed and workload.activation_checkpointing is None:
            raise WorkloadError(
                f"workload {request.workload!r}: cannot switch activation checkpointing on "
                f"(the config's {CHECKPOINTING_KEY}); a built-in gpt or an hf: workload can"
            )
        # Checkpointed activations are measured only where the config asks for them: a
        # 7B model's passes are most of a plan's time.
        switch = workload.activation_checkpointing if checkpointed else None
        info = model_info_on_meta(workload, config.precision, switch)
    except WorkloadError:
        raise
    except Exception as err:  # an op without a meta kernel, a tensor made on a fixed device
        raise WorkloadError(
            f"workload {request.workload!r}: planning builds it on the meta device, where it "
            f"failed ({type(err).__name__}: {err})"
        ) from None
    model = fitted
    if model is not None:
        data_parallel = max(1, config.world_size // config.autotuning.mp_size)
        topology = Topology(data_parallel, min(per_node, data_parallel), config.precision)
        if topology.spans_nodes:
            # A run on one node never measured the network: the datasheet's figure stands.
            model = model.with_prior_for(["network_bandwidth"], prior_for(hardware, topology))
    return plan(config, info, hardware, per_node, model), hardware, fitted


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
