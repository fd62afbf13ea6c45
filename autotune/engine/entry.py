"""DeepSpeed's entry point, ``initialize``: the config resolved, the engine built, and the
client's own optimizer and scheduler (instances or callables) adapted to the engine's shards.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from autotune.config import Config, ConfigError, load_config
from autotune.engine import hooks
from autotune.engine.engine import ZeroEngine
from autotune.engine.launch import ConfigSource, config_source, resolve_group, script_config
from autotune.engine.master import OptimizerFactory


def initialize(
    args: Any = None,
    model: nn.Module | None = None,
    optimizer: Any = None,
    model_parameters: Iterable[Any] | None = None,
    training_data: torch.utils.data.Dataset[Any] | None = None,
    lr_scheduler: Any = None,
    distributed_port: int | None = None,
    mpu: Any = None,
    dist_init_required: bool | None = None,
    collate_fn: Any = None,
    config: ConfigSource | None = None,
    mesh_param: Any = None,
    config_params: ConfigSource | None = None,
    *,
    process_group: dist.ProcessGroup | None = None,
    device_memory_bytes: int | None = None,
) -> tuple[ZeroEngine, torch.optim.Optimizer, torch.utils.data.DataLoader[Any] | None, Any]:
    """Wrap ``model`` for ZeRO training, as ``deepspeed.initialize`` does (same arguments).

    Args:
        args: a script's parsed arguments; ``args.deepspeed_config`` (a path or dict) is the
            config when neither ``config`` nor ``config_params`` is given.
        model: the model to train.
        optimizer: a client optimizer instead of the config's ``optimizer`` section: a
            callable taking param groups (called on this rank's shards), or an instance,
            rebuilt over the shards from its class, defaults and param groups (it must not
            have stepped). It is stepped on flat 1-D slices, so it must be elementwise (Adam,
            AdamW, SGD, Adagrad, RMSprop, ...); Lamb is chosen in the config instead.
        model_parameters: the parameters to train (or param groups); all by default, or the
            client optimizer instance's param groups.
        training_data: a dataset; a loader of micro-batches over a distributed sampler is
            returned for it.
        lr_scheduler: a client scheduler instead of the config's ``scheduler``: a callable
            taking the engine's optimizer, or an instance bound to the client optimizer
            instance (re-bound to the engine's). The engine steps it after every optimizer
            step, as DeepSpeed does.
        distributed_port, dist_init_required: accepted; without a process group one is made
            from torchrun's environment (see :func:`init_distributed` to make it yourself).
        mpu, mesh_param: model and sequence parallelism are not supported; must be None.
        collate_fn: the loader's collate function.
        config, config_params: a DeepSpeed config (path, dict or
            :class:`~autotune.config.Config`); either one, or ``args.deepspeed_config``.
        process_group: the ranks to train over; by default the initialised default group,
            else one made from torchrun's environment, else a single process on its own.
        device_memory_bytes: a per-rank memory budget (overrides ``device_memory_bytes`` in
            the config); going over it raises ``torch.OutOfMemoryError`` on every rank.

    Returns:
        ``(engine, optimizer, dataloader, lr_scheduler)``.

    Raises:
        ConfigError: no config, two different ones, an invalid one, or an optimizer or
            scheduler given both in the config and as an argument.

    Example:
        >>> from autotune.workloads import build_mlp
        >>> mlp = build_mlp(d_in=8, d_hidden=16, n_layer=1)
        >>> engine, optimizer, _, _ = initialize(model=mlp.model, config={
        ...     "train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 3}})
        >>> batch = mlp.make_batch(4, torch.Generator().manual_seed(0))
        >>> loss = engine(*batch)
        >>> engine.backward(loss)  # returns the loss, as DeepSpeed's does
        tensor(..., grad_fn=<NllLossBackward0>)
        >>> engine.step()
        >>> engine.global_steps, engine.world_size
        (1, 1)
    """
    del distributed_port, dist_init_required
    if model is None:
        raise ValueError("initialize() needs a model")
    if mpu is not None or mesh_param is not None:
        raise ValueError(
            "initialize(mpu=..., mesh_param=...): model and sequence parallelism are not "
            "supported by the engine (data parallelism only)"
        )
    observer = hooks.current()
    if observer is not None:  # script mode: the experiment's config over the script's own
        source = observer.configure(script_config(args, config, config_params))
    else:
        source = config_source(args, config, config_params)
    if source is None:
        raise ConfigError(
            "",
            "initialize() needs a config: pass config=... (a path or dict) or set "
            "args.deepspeed_config (--deepspeed_config with add_config_arguments)",
        )
    group = resolve_group(process_group)
    world_size = dist.get_world_size(group) if group is not None else 1
    if isinstance(source, Config):
        loaded = source if source.world_size == world_size else load_config(source, world_size)
    else:
        loaded = load_config(source, world_size=world_size)
    _check_client_parts(loaded, optimizer, lr_scheduler)
    model_parameters, factory = _client_optimizer(optimizer, model_parameters)
    engine = ZeroEngine(model, loaded, group, model_parameters, device_memory_bytes, factory)
    if isinstance(optimizer, torch.optim.Optimizer):
        # The client's instance now holds the engine's param groups, so what drives its rates
        # (a scheduler bound to it that initialize() never saw, as Accelerate keeps one) drives
        # the engine's: with DeepSpeed the client's instance is the one stepped.
        optimizer.param_groups = engine.optimizer.param_groups
    if lr_scheduler is not None:
        engine.lr_scheduler = _client_scheduler(lr_scheduler, engine.optimizer, optimizer)
    if observer is not None:
        observer.on_engine(engine)
    loader = None
    if training_data is not None:
        # Always a DistributedSampler, as DeepSpeed's loader: scripts call set_epoch on it.
        sampler: torch.utils.data.DistributedSampler[Any] = torch.utils.data.DistributedSampler(
            training_data, num_replicas=world_size, rank=engine.communicator.rank
        )
        loader = torch.utils.data.DataLoader(
            training_data,
            batch_size=engine.train_micro_batch_size_per_gpu(),
            sampler=sampler,
            collate_fn=collate_fn,
            drop_last=loaded.dataloader_drop_last,
        )
    return engine, engine.optimizer, loader, engine.lr_scheduler


def _check_client_parts(config: Config, optimizer: Any, lr_scheduler: Any) -> None:
    """An optimizer or scheduler given twice is ambiguous: refuse it rather than pick one."""
    if optimizer is not None and config.optimizer is not None:
        raise ConfigError(
            "optimizer",
            "given both in the config and as initialize(optimizer=...); keep one",
        )
    if lr_scheduler is not None and config.scheduler is not None:
        raise ConfigError(
            "scheduler",
            "given both in the config and as initialize(lr_scheduler=...); keep one",
        )


def _client_optimizer(
    optimizer: Any, model_parameters: Iterable[Any] | None
) -> tuple[Iterable[Any] | None, OptimizerFactory | None]:
    """The parameters to train and how to build the optimizer over the engine's shards.

    A ZeRO rank steps only its shard, never the model's parameters, so a client optimizer
    instance cannot be used as it is: it is built again, from its class and defaults, over
    the shards, with its param groups' options (learning rates a scheduler already set
    included). Its param groups say what is trained.
    """
    if optimizer is None:
        return model_parameters, None
    if not isinstance(optimizer, torch.optim.Optimizer):
        if not callable(optimizer):
            raise TypeError(
                "initialize(optimizer=...) takes a torch.optim.Optimizer or a callable "
                f"building one from param groups, got {type(optimizer).__name__}"
            )
        return model_parameters, optimizer
    if any(optimizer.state.values()):
        raise ValueError(
            f"initialize(optimizer=...): this {type(optimizer).__name__} has already stepped "
            "and its state cannot be carried onto the engine's shards; pass a fresh one"
        )
    cls, defaults = type(optimizer), _constructor_options(type(optimizer), optimizer.defaults)
    groups = [dict(group) for group in optimizer.param_groups]

    def rebuild(param_groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
        try:
            return cls(param_groups, **defaults)
        except TypeError as err:
            raise ValueError(
                f"initialize(optimizer=...): cannot build {cls.__name__} again over the "
                f"engine's shards from its defaults ({err}); pass a callable instead, e.g. "
                f"optimizer=lambda params: {cls.__name__}(params, lr=...)"
            ) from None

    return groups, rebuild


def _constructor_options(cls: type, defaults: dict[str, Any]) -> dict[str, Any]:
    """The defaults ``cls`` takes as arguments (some record derived ones, e.g. AdamW's
    ``decoupled_weight_decay``); each param group carries all of them anyway."""
    parameters = inspect.signature(cls).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return dict(defaults)
    names = {p.name for p in parameters}
    return {k: v for k, v in defaults.items() if k in names}


def _client_scheduler(
    lr_scheduler: Any, engine_optimizer: torch.optim.Optimizer, client_optimizer: Any
) -> Any:
    """The client's scheduler, driving the engine's optimizer."""
    bound = getattr(lr_scheduler, "optimizer", None)
    if bound is None:
        if not callable(lr_scheduler):
            raise TypeError(
                "initialize(lr_scheduler=...) takes a scheduler or a callable building one "
                f"from the optimizer, got {type(lr_scheduler).__name__}"
            )
        return lr_scheduler(engine_optimizer)
    if bound is engine_optimizer:
        return lr_scheduler
    if bound is not client_optimizer or not isinstance(client_optimizer, torch.optim.Optimizer):
        raise ValueError(
            "initialize(lr_scheduler=...) is bound to an optimizer the engine does not step; "
            "pass a callable instead, e.g. lr_scheduler=lambda opt: LambdaLR(opt, ...)"
        )
    return _rebind(lr_scheduler, engine_optimizer)


def _rebind(scheduler: Any, optimizer: torch.optim.Optimizer) -> Any:
    """A copy of ``scheduler`` (and the schedulers it chains) stepping ``optimizer``.

    Its progress (last_epoch, base rates) is kept; the learning rates it already set live in
    the param group options the engine's optimizer was built with.
    """
    rebound = copy.copy(scheduler)
    rebound.optimizer = optimizer
    children = getattr(scheduler, "_schedulers", None)
    if isinstance(children, list):
        rebound._schedulers = [_rebind(child, optimizer) for child in children]
    return rebound
