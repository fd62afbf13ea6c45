"""The DeepSpeed API a training script uses, in one process: where the config comes from,
the command-line options, comm helpers, accessors, client optimizers and schedulers."""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
import torch

import autotune as deepspeed
from autotune.config import ConfigError

CONFIG = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1}}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def _args(tmp_path: Path, config: dict[str, Any] | None = None) -> argparse.Namespace:
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config or CONFIG))
    parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
    return parser.parse_args(["--deepspeed", "--deepspeed_config", str(path)])


def test_add_config_arguments_adds_deepspeeds_options(tmp_path: Path) -> None:
    args = _args(tmp_path)
    assert args.deepspeed is True and args.deepspeed_config.endswith("ds_config.json")
    defaults = deepspeed.add_config_arguments(argparse.ArgumentParser()).parse_args([])
    assert defaults.deepspeed is False and defaults.deepspeed_config is None


def test_config_from_args(tmp_path: Path) -> None:
    engine, *_ = deepspeed.initialize(args=_args(tmp_path), model=_model())
    assert engine.zero_optimization_stage() == 1 and engine.train_micro_batch_size_per_gpu() == 2


def test_config_from_args_as_a_dict() -> None:
    args = argparse.Namespace(deepspeed_config=CONFIG)
    engine, *_ = deepspeed.initialize(args=args, model=_model())
    assert engine.zero_optimization_stage() == 1


@pytest.mark.parametrize("name", ["config", "config_params"])
def test_config_or_config_params_win_over_args_without_one(name: str) -> None:
    args = argparse.Namespace(deepspeed_config=None, local_rank=0)
    engine, *_ = deepspeed.initialize(args=args, model=_model(), **{name: CONFIG})
    assert engine.zero_optimization_stage() == 1


def test_the_same_config_twice_is_fine(tmp_path: Path) -> None:
    args = _args(tmp_path)
    engine, *_ = deepspeed.initialize(args=args, model=_model(), config=args.deepspeed_config)
    assert engine.zero_optimization_stage() == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"config": CONFIG, "config_params": {"train_batch_size": 4}}, "both config and"),
        ({"config": {"train_batch_size": 4}, "args": "from_file"}, "differ"),
        ({}, "needs a config.*deepspeed_config"),
        ({"args": argparse.Namespace(deepspeed_config=None)}, "needs a config"),
    ],
)
def test_ambiguous_or_missing_config_is_an_error(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    if kwargs.get("args") == "from_file":
        kwargs["args"] = _args(tmp_path)
    with pytest.raises(ConfigError, match=message):
        deepspeed.initialize(model=_model(), **kwargs)


@pytest.mark.parametrize(
    ("section", "fp16", "bf16"), [("fp16", True, False), ("bf16", False, True)]
)
def test_precision_accessors(section: str, fp16: bool, bf16: bool) -> None:
    config = {**CONFIG, section: {"enabled": True}}
    engine, _, _, _ = deepspeed.initialize(model=_model(), config=config)
    assert (engine.fp16_enabled(), engine.bfloat16_enabled()) == (fp16, bf16)


def test_bf16_options_the_engine_lacks_are_refused_not_ignored() -> None:
    for key in ("bf16_master_weights_and_grads", "bf16_optimizer_states"):
        config = {**CONFIG, "bf16": {"enabled": True, key: True}}
        with pytest.raises(ConfigError, match=f"bf16.{key}.*not supported"):
            deepspeed.initialize(model=_model(), config=config)


def test_log_dist_prints_on_the_ranks_asked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    log_dist = deepspeed.utils.log_dist  # HelloDeepSpeed: from deepspeed.utils import ...

    log_dist("before the group: every rank", ranks=[0])
    monkeypatch.setattr(deepspeed.comm, "is_initialized", lambda: True)
    monkeypatch.setattr(deepspeed.comm, "get_rank", lambda: 1)
    log_dist("rank 0 only", ranks=[0])
    log_dist("all ranks", ranks=[-1])
    log_dist("rank 1 too", ranks=[0, 1])
    out = capsys.readouterr().out
    assert "[Rank -1] before the group: every rank" in out and "rank 0 only" not in out
    assert "[Rank 1] all ranks" in out and "[Rank 1] rank 1 too" in out


def test_comm_helpers_answer_without_a_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    assert deepspeed.comm.get_rank() == 0 and deepspeed.comm.get_world_size() == 1
    assert deepspeed.comm.get_local_rank() == 0 and not deepspeed.comm.is_initialized()
    deepspeed.comm.barrier()
    import autotune.comm as dist
    import autotune.zero as zero

    assert dist is deepspeed.comm and zero is deepspeed.zero


def test_engine_accessors() -> None:
    config = {
        "train_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "gradient_clipping": 0.5,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
    }
    engine, optimizer, _, _ = deepspeed.initialize(model=_model(), config=config)
    assert (engine.global_rank, engine.world_size, engine.local_rank) == (0, 1, 0)
    # What DeepSpeedExamples' cifar asks before its loop: the dtype and the device name.
    assert not engine.fp16_enabled() and not engine.bfloat16_enabled()
    assert (engine.zero_optimization_stage(), engine.zero_optimization()) == (0, False)
    assert engine.gradient_clipping() == 0.5 and not engine.zero_cpu_offload()
    assert deepspeed.accelerator.get_accelerator().device_name(engine.local_rank) == "cpu"
    assert engine.device == torch.device("cpu") and engine.optimizer is optimizer
    assert engine.train_batch_size() == 4 and engine.gradient_accumulation_steps() == 2
    assert engine.get_global_grad_norm() is None and not engine.was_step_skipped()
    engine.eval()
    assert not engine.module.training
    engine.train()
    for _ in range(2):
        engine.backward(engine(torch.randn(2, 4)).pow(2).sum() * 100)
        engine.step()
    assert (engine.global_steps, engine.micro_steps) == (1, 2)
    norm = engine.get_global_grad_norm()
    assert norm is not None and norm > 0.5  # before clipping
    assert engine.get_lr() == [0.1] and not engine.was_step_skipped()


def _plain_training(model: torch.nn.Module, optimizer: Any, scheduler: Any, steps: int) -> None:
    for step in range(steps):
        x = torch.randn(2, 4, generator=torch.Generator().manual_seed(step))
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        if scheduler is not None:
            scheduler.step()


def _engine_training(engine: Any, steps: int) -> None:
    for step in range(steps):
        x = torch.randn(2, 4, generator=torch.Generator().manual_seed(step))
        engine.backward(engine(x).pow(2).mean())
        engine.step()


def _groups(model: torch.nn.Module) -> list[dict[str, Any]]:
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    return [{"params": weights, "weight_decay": 0.1}, {"params": biases, "lr": 0.05}]


@pytest.mark.parametrize("form", ["instance", "callable"])
@pytest.mark.parametrize("stage", [0, 2])
def test_client_optimizer_and_scheduler_train_like_torch(form: str, stage: int) -> None:
    def make_optimizer(params: Any) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=0.02, weight_decay=0.0)

    def make_scheduler(opt: torch.optim.Optimizer) -> Any:
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))

    expected = _model()
    opt = make_optimizer(_groups(expected))
    _plain_training(expected, opt, make_scheduler(opt), steps=4)

    model = _model()
    client_opt: Any = make_optimizer(_groups(model)) if form == "instance" else make_optimizer
    client_sched: Any = make_scheduler(client_opt) if form == "instance" else make_scheduler
    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage}}
    engine, optimizer, _, scheduler = deepspeed.initialize(
        model=model,
        model_parameters=None if form == "instance" else _groups(model),
        optimizer=client_opt,
        lr_scheduler=client_sched,
        config=config,
    )
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer is not client_opt
    assert scheduler.optimizer is optimizer
    _engine_training(engine, steps=4)
    assert engine.get_lr() == [g["lr"] for g in opt.param_groups]
    for name, value in expected.state_dict().items():
        torch.testing.assert_close(engine.module_state_dict()[name], value, msg=name)


def test_a_scheduler_the_engine_never_saw_still_drives_the_rates() -> None:
    """Accelerate keeps a client scheduler (a LambdaLR) bound to the client optimizer and steps
    it itself: its rates must reach the engine's optimizer, as DeepSpeed steps that instance."""
    expected = _model()
    opt = torch.optim.AdamW(_groups(expected), lr=0.02)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    _plain_training(expected, opt, sched, steps=4)

    model = _model()
    client = torch.optim.AdamW(_groups(model), lr=0.02)
    client_sched = torch.optim.lr_scheduler.LambdaLR(client, lambda step: 1.0 / (1 + step))
    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1}}
    engine, *_ = deepspeed.initialize(model=model, optimizer=client, config=config)
    for step in range(4):
        x = torch.randn(2, 4, generator=torch.Generator().manual_seed(step))
        engine.backward(engine(x).pow(2).mean())
        engine.step()
        client_sched.step()
    assert engine.get_lr() == [g["lr"] for g in opt.param_groups]
    for name, value in expected.state_dict().items():
        torch.testing.assert_close(engine.module_state_dict()[name], value, msg=name)


def test_client_optimizer_errors_name_the_fix() -> None:
    model = _model()
    stepped = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(1, 4)).sum().backward()
    stepped.step()
    with pytest.raises(ValueError, match="already stepped"):
        deepspeed.initialize(model=model, optimizer=stepped, config=CONFIG)
    other = torch.optim.SGD(_model().parameters(), lr=0.1)
    unrelated = torch.optim.lr_scheduler.StepLR(other, 2)
    with pytest.raises(ValueError, match="pass a callable"):
        deepspeed.initialize(
            model=_model(),
            optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
            lr_scheduler=unrelated,
            config=CONFIG,
        )
    with pytest.raises(ConfigError, match="optimizer: given both"):
        deepspeed.initialize(
            model=_model(),
            optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
            config={**CONFIG, "optimizer": {"type": "Adam"}},
        )


def test_zero_init_and_gathered_parameters_in_one_process() -> None:
    with deepspeed.zero.Init(remote_device="cpu", pin_memory=False):
        model = _model()
    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3}}
    config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    engine, *_ = deepspeed.initialize(model=model, config=config)
    weight = model[0].weight
    with deepspeed.zero.GatheredParameters(weight, modifier_rank=0):
        assert weight.shape == (8, 4) and bool(torch.isfinite(weight).all())
        with torch.no_grad():
            weight.fill_(0.25)
    assert bool((engine.module_state_dict()["0.weight"] == 0.25).all())
    # Read only: changes are dropped.
    with deepspeed.zero.GatheredParameters([weight]), torch.no_grad():
        weight.fill_(3.0)
    assert bool((engine.module_state_dict()["0.weight"] == 0.25).all())
    # A block that raises keeps nothing: the exception reaches the engine's context.
    modifying = deepspeed.zero.GatheredParameters(weight, modifier_rank=0)
    with pytest.raises(RuntimeError, match="abandoned"), modifying, torch.no_grad():
        weight.fill_(5.0)
        raise RuntimeError("abandoned")
    assert bool((engine.module_state_dict()["0.weight"] == 0.25).all())


class _Recorder:
    """An observer as a script-mode runner installs one: it replaces the script's config."""

    def __init__(self) -> None:
        self.seen: list[Any] = []
        self.steps = 0

    def configure(self, config: Any) -> Any:
        self.seen.append(config)
        return {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}

    def on_engine(self, engine: Any) -> None:
        self.seen.append(engine.zero_optimization_stage())

    def on_forward(self, engine: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        pass

    def on_optimizer_step(self, engine: Any) -> None:
        self.steps += 1


def test_an_observer_sees_the_scripts_config_and_replaces_it(tmp_path: Path) -> None:
    from autotune.engine import hooks

    args = _args(tmp_path)
    with hooks.observing(_Recorder()) as recorder:
        engine, *_ = deepspeed.initialize(args=args, model=_model())
        _engine_training(engine, steps=2)
    assert recorder.seen == [CONFIG, 2] and recorder.steps == 2  # the file, read
    with hooks.observing(_Recorder()) as recorder:  # a script with no config of its own
        deepspeed.initialize(model=_model())
    assert recorder.seen == [None, 2]
    # A dict in the script and a file in its args: DeepSpeed refuses; in script mode the
    # experiment's config replaces both, so the script's dict is passed on, no error.
    own = {"train_batch_size": 16, "fp16": {"enabled": True}}
    with hooks.observing(_Recorder()) as recorder:
        deepspeed.initialize(args=args, model=_model(), config=own)
    assert recorder.seen == [own, 2]


LONE_SCRIPT = """
import sys, torch
import autotune
sys.modules["deepspeed"] = autotune      # what a runner does so `import deepspeed` works
import deepspeed
import deepspeed.comm as dist
from deepspeed import zero

deepspeed.init_distributed()
deepspeed.init_distributed()             # idempotent
assert dist.is_initialized() and (dist.get_rank(), dist.get_world_size()) == (0, 1)
with zero.Init():
    model = torch.nn.Linear(4, 1)
config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3}}
engine, *_ = deepspeed.initialize(model=model, config=config)
for _ in range(2):
    engine.backward(engine(torch.ones(2, 4)).pow(2).mean())
    engine.step()
engine.save_checkpoint(sys.argv[1])
dist.barrier()
print("lone ok", engine.global_steps, flush=True)
dist.destroy_process_group()
"""


def test_a_lone_process_with_init_distributed_and_deepspeed_imports(tmp_path: Path) -> None:
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    done = subprocess.run(
        [sys.executable, "-c", LONE_SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0 and "lone ok 2" in done.stdout, done.stdout + done.stderr
    assert (tmp_path / "latest").read_text() == "global_step2"


def test_an_fp16_overflow_is_reported_as_a_skipped_step() -> None:
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "fp16": {"enabled": True, "initial_scale_power": 30, "hysteresis": 1},
    }
    engine, *_ = deepspeed.initialize(model=_model(), config=config)
    inputs = torch.full((2, 4), 100.0, dtype=torch.float16)
    engine.backward(engine(inputs).float().pow(2).mean())
    engine.step()
    assert engine.was_step_skipped() and engine.skipped_steps == 1
    norm = engine.get_global_grad_norm()
    assert norm is not None and not math.isfinite(norm)


def test_training_data_gives_micro_batches_over_a_distributed_sampler() -> None:
    inputs = torch.randn(10, 4).half()  # fp16 inputs on CPU collate as they are
    data = torch.utils.data.TensorDataset(inputs, torch.randn(10, 1))
    config = {"train_micro_batch_size_per_gpu": 4, "fp16": {"enabled": True}}
    engine, _, loader, _ = deepspeed.initialize(model=_model(), config=config, training_data=data)
    assert isinstance(loader.sampler, torch.utils.data.DistributedSampler)
    loader.sampler.set_epoch(1)
    batches = list(loader)
    assert [len(x) for x, _ in batches] == [4, 4, 2] and batches[0][0].dtype == torch.float16
    loss = torch.nn.functional.mse_loss(engine(batches[0][0]).float(), batches[0][1])
    engine.backward(loss)
    engine.step()
    assert engine.global_steps == 1


@pytest.mark.parametrize("stage", [0, 3])
def test_a_checkpoint_without_frozen_parameters_keeps_the_models_own(
    tmp_path: Path, stage: int
) -> None:
    """``save_checkpoint(exclude_frozen_parameters=True)`` (the HF Trainer's, for PEFT) leaves
    the frozen base out; loading keeps the new model's values for it."""

    def frozen_first_layer() -> torch.nn.Module:
        model = _model()
        model[0].requires_grad_(False)
        return model

    config = {
        "train_micro_batch_size_per_gpu": 2,
        "zero_optimization": {"stage": stage},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
    }
    engine, *_ = deepspeed.initialize(model=frozen_first_layer(), config=config)
    _engine_training(engine, steps=2)
    engine.save_checkpoint(tmp_path, exclude_frozen_parameters=True)
    saved = torch.load(tmp_path / "global_step2" / "mp_rank_00_model_states.pt", weights_only=False)
    assert not any(name.startswith("0.") for name in saved["module"])
    trained = engine.module_state_dict()

    fresh = frozen_first_layer()
    with torch.no_grad():
        fresh[0].weight.fill_(0.5)  # a base of its own
    resumed, *_ = deepspeed.initialize(model=fresh, config=config)
    path, _ = resumed.load_checkpoint(tmp_path)
    assert path is not None and resumed.global_steps == 2
    state = resumed.module_state_dict()
    assert torch.equal(state["0.weight"], torch.full((8, 4), 0.5))
    torch.testing.assert_close(state["2.weight"], trained["2.weight"])


def _zero3(model: torch.nn.Module, persistence_threshold: int = 0) -> Any:
    zero = {"stage": 3, "stage3_param_persistence_threshold": persistence_threshold}
    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": zero}
    return deepspeed.initialize(model=model, config=config)[0]


def test_zero3_parameters_carry_deepspeeds_attributes_true_to_where_their_data_is() -> None:
    from autotune.deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    model = _model()
    model[2].requires_grad_(False)  # a frozen head: held whole, as the engine holds it
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    engine = _zero3(model)
    weight, head = model[0].weight, model[2].weight
    assert weight.ds_status == ZeroParamStatus.NOT_AVAILABLE
    assert (weight.ds_numel, tuple(weight.ds_shape)) == (32, (8, 4))
    # One rank holds all of it: its part is the whole parameter, flat.
    assert weight.partition_numel() == 32 and torch.equal(
        weight.ds_tensor, before["0.weight"].flatten()
    )
    assert head.ds_status == ZeroParamStatus.AVAILABLE and head.partition_numel() == 8
    ids = [p.ds_id for p in model.parameters()]
    assert len(set(ids)) == len(ids)

    seen = []
    model[0].register_forward_pre_hook(lambda module, args: seen.append(module.weight.ds_status))
    _engine_training(engine, steps=1)
    assert seen == [ZeroParamStatus.AVAILABLE]  # while its layer is gathered
    assert weight.ds_status == ZeroParamStatus.NOT_AVAILABLE
    with deepspeed.zero.GatheredParameters([weight]):
        assert weight.ds_status == ZeroParamStatus.AVAILABLE
        assert torch.equal(weight.detach().flatten(), weight.ds_tensor)
    assert weight.ds_status == ZeroParamStatus.NOT_AVAILABLE
    # What the Trainer saves for a PEFT model at ZeRO-3: the trained parameters, whole.
    state = engine._zero3_consolidated_16bit_state_dict(exclude_frozen_parameters=True)
    assert set(state) == {"0.weight", "0.bias"}

    # Small parameters share a unit that stays gathered: available always.
    small = _zero3(_model(), persistence_threshold=1000)
    assert all(p.ds_status == ZeroParamStatus.AVAILABLE for p in small.module.parameters())
    # Below stage 3 DeepSpeed sets none of them, and neither does the engine.
    flat, *_ = deepspeed.initialize(model=_model(), config=CONFIG)
    assert not any(hasattr(p, "ds_status") for p in flat.module.parameters())


class _Head(torch.autograd.Function):
    """A client's fused head, as TRL's chunked log-prob loss: it reads the head's weight
    itself (no module call), saves it, and at ZeRO-3 gathers it again in backward if it is not
    there."""

    @staticmethod
    def forward(
        ctx: Any, hidden: torch.Tensor, weight: torch.nn.Parameter, zero3: bool
    ) -> torch.Tensor:
        ctx.save_for_backward(hidden, weight)
        ctx.zero3 = zero3
        return hidden @ weight.t()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        from autotune.deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

        hidden, weight = ctx.saved_tensors
        gathering = ctx.zero3 and weight.ds_status != ZeroParamStatus.AVAILABLE
        with deepspeed.zero.GatheredParameters([weight], enabled=gathering):
            return grad @ weight, grad.t() @ hidden, None


class _FusedHead(torch.nn.Module):
    def __init__(self, zero3: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Linear(4, 8)
        self.head = torch.nn.Linear(8, 5, bias=False)
        self.zero3 = zero3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from autotune.deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

        hidden = torch.tanh(self.body(x))
        weight = self.head.weight
        gathering = self.zero3 and weight.ds_status != ZeroParamStatus.AVAILABLE
        with deepspeed.zero.GatheredParameters([weight], enabled=gathering):
            return _Head.apply(hidden, weight, self.zero3).square().mean()


def test_a_client_that_gathers_a_head_it_reads_itself_trains_as_at_stage_0() -> None:
    """The head is partitioned at ZeRO-3: the client gathers it in forward, and in backward
    gets back the parameter it saved (not a copy), sees it partitioned again and gathers it."""
    losses = {}
    for stage in (0, 3):
        config = {
            "train_micro_batch_size_per_gpu": 2,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.05}},
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
        }
        engine, *_ = deepspeed.initialize(model=_FusedHead(stage == 3), config=config)
        losses[stage] = []
        for step in range(4):
            loss = engine(torch.linspace(-1, 1, 8).view(2, 4) * (step + 1))
            engine.backward(loss)
            engine.step()
            losses[stage].append(loss.item())
    assert losses[3] == pytest.approx(losses[0], rel=1e-6)
    assert len(set(losses[0])) == 4


def test_what_the_engine_does_not_do_is_refused_naming_it() -> None:
    engine, *_ = deepspeed.initialize(model=_model(), config=CONFIG)
    with pytest.raises(NotImplementedError, match=r"engine\.compile\(\) is not served"):
        engine.compile(backend="inductor", compile_kwargs={})
    autotp = {**CONFIG, "tensor_parallel": {"autotp_size": 2}}
    with pytest.raises(ConfigError, match=r"tensor_parallel\.autotp_size: 2 is not supported"):
        deepspeed.initialize(model=_model(), config=autotp)
    deepspeed.initialize(model=_model(), config={**CONFIG, "tensor_parallel": {"autotp_size": 1}})
