"""A script as ``accelerate launch`` (or TRL's ``trl <command>``) starts it, without the launcher.

``accelerate launch --config_file deepspeed_zero2.yaml sft.py ...`` is how most DeepSpeed users
start training: the YAML's ``distributed_type: DEEPSPEED`` and its ``deepspeed_config`` map (or
``deepspeed_config_file``) become environment variables (``ACCELERATE_USE_DEEPSPEED``,
``ACCELERATE_DEEPSPEED_ZERO_STAGE``, ``ACCELERATE_DEEPSPEED_CONFIG_FILE``, ...) from which
Accelerate's ``DeepSpeedPlugin`` builds the DeepSpeed config inside the script, and
``num_processes`` ranks are started by torchrun. autotune starts the ranks itself, so it never
runs the launcher: :func:`parse_accelerate_launch` reads the command line with Accelerate's own
parser and the YAML as Accelerate reads it, and :class:`AccelerateLaunch` says what the tuner
needs from them:

- the DeepSpeed config to tune (:meth:`AccelerateLaunch.ds_config`): the one Accelerate's
  plugin would build from the map (``"auto"`` where Accelerate fills a value in), or the
  ``deepspeed_config_file``'s, with the YAML's ``mixed_precision`` as a ``bf16``/``fp16``
  section (Accelerate's own rule: added where the config has none);
- each experiment's environment (:meth:`AccelerateLaunch.environment`): what ``accelerate
  launch`` sets for the YAML :meth:`AccelerateLaunch.with_config_file` makes of the user's,
  whose ``deepspeed_config_file`` is the experiment's own config file;
- the answer: that YAML naming ``ds_config_optimal.json`` and the command that trains with it.

The driver side imports Accelerate (and TRL for ``trl`` commands) only for such a command line;
the rank side needs neither: what it uses is plain data.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

# Keys of the YAML's deepspeed_config map that Accelerate refuses next to a deepspeed_config_file
# (DeepSpeedPlugin._deepspeed_config_checks): their values live in the JSON file instead.
FILE_FORM_REFUSES = (
    "gradient_accumulation_steps",
    "gradient_clipping",
    "zero_stage",
    "offload_optimizer_device",
    "offload_param_device",
    "offload_param_nvme_path",
    "offload_optimizer_nvme_path",
    "zero3_save_16bit_model",
)
# The launch flags whose values the tuned YAML or its JSON file holds: left out of the command
# that trains with them.
_FOLDED_FLAGS = (
    *FILE_FORM_REFUSES,
    "config_file",
    "deepspeed_config_file",
    "num_processes",
    "mixed_precision",
    "use_deepspeed",
    "module",
)
# Beside a results directory's ds_config_optimal.json, for a script started by accelerate
# launch: the YAML that names it.
LAUNCH_CONFIG_NAME = "accelerate_config_optimal.yaml"
# Precision sections as Accelerate's DeepSpeedPlugin.set_mixed_precision adds them.
_PRECISION_SECTIONS: dict[str, dict[str, Any]] = {
    "bf16": {"bf16": {"enabled": True}},
    "fp16": {"fp16": {"enabled": True, "auto_cast": True}},
}
# The deepspeed_config keys accelerate launch passes on as environment variables.
_ENVIRONMENT = {
    "zero_stage": "ACCELERATE_DEEPSPEED_ZERO_STAGE",
    "gradient_accumulation_steps": "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
    "gradient_clipping": "ACCELERATE_GRADIENT_CLIPPING",
    "offload_optimizer_device": "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE",
    "offload_param_device": "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE",
    "zero3_init_flag": "ACCELERATE_DEEPSPEED_ZERO3_INIT",
    "zero3_save_16bit_model": "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL",
    "deepspeed_config_file": "ACCELERATE_DEEPSPEED_CONFIG_FILE",
    "deepspeed_moe_layer_cls_names": "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES",
}


class LaunchError(ValueError):
    """The launcher's command line or its YAML cannot be tuned as given (one line)."""


@dataclass(frozen=True)
class AccelerateLaunch:
    """``accelerate launch`` (or ``trl <command>``) as the user wrote it, read.

    Attributes:
        yaml_path: the ``--config_file`` (absolute), or None.
        yaml: the YAML as written (empty without one).
        flags: the launch flags given, by Accelerate's names (``num_processes``,
            ``zero_stage``, ...); a flag wins over the YAML, as in ``accelerate launch``.
        kept_args: the launch flags the answer's command keeps as written (those not folded
            into the tuned YAML), e.g. ``["--main_process_port", "29600"]``.
        trl_command: for ``trl <command>``: the command (``sft``), printed again in that form.
    """

    yaml_path: str | None
    yaml: Mapping[str, Any] = field(default_factory=dict)
    flags: Mapping[str, Any] = field(default_factory=dict)
    kept_args: tuple[str, ...] = ()
    trl_command: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AccelerateLaunch:
        """The launch as :meth:`to_dict` wrote it."""
        return cls(
            yaml_path=data.get("yaml_path"),
            yaml=dict(data.get("yaml", {})),
            flags=dict(data.get("flags", {})),
            kept_args=tuple(data.get("kept_args", ())),
            trl_command=data.get("trl_command"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "yaml_path": self.yaml_path,
            "yaml": dict(self.yaml),
            "flags": dict(self.flags),
            "kept_args": list(self.kept_args),
            "trl_command": self.trl_command,
        }

    @property
    def settings(self) -> dict[str, Any]:
        """The YAML with the flags given laid over it (``deepspeed_config`` keys by their
        flag names), as ``accelerate launch`` merges them."""
        settings = dict(self.yaml)
        ds = dict(settings.get("deepspeed_config") or {})
        for name, value in self.flags.items():
            if name in _DEEPSPEED_FLAGS:
                ds[name] = value
            elif value is not None:
                settings[name] = value
        if self.flags.get("use_deepspeed"):
            settings["distributed_type"] = "DEEPSPEED"
        settings["deepspeed_config"] = ds
        return settings

    @property
    def deepspeed(self) -> Mapping[str, Any]:
        """The ``deepspeed_config`` map, flags included."""
        return self.settings["deepspeed_config"]

    @property
    def num_processes(self) -> int | None:
        value = self.settings.get("num_processes")
        return int(value) if value not in (None, -1) else None

    @property
    def mixed_precision(self) -> str:
        return str(self.settings.get("mixed_precision") or "no").lower()

    @property
    def config_file(self) -> str | None:
        """The ``deepspeed_config_file`` the YAML (or a flag) names, if any."""
        found = self.deepspeed.get("deepspeed_config_file")
        return str(found) if found not in (None, "none", "") else None

    def map_config(self) -> dict[str, Any]:
        """The DeepSpeed config the ``deepspeed_config`` map stands for, as
        ``DeepSpeedPlugin.__post_init__`` builds it from the variables the launch sets
        (``"auto"`` where Accelerate or the HF Trainer fills the value in at ``prepare``);
        its precision is :func:`with_precision`'s."""
        ds = self.deepspeed
        zero: dict[str, Any] = {"stage": int(ds.get("zero_stage", 2))}
        for part in ("optimizer", "param"):
            device = str(ds.get(f"offload_{part}_device") or "none").lower()
            if device != "none":
                section = {"device": device}
                nvme = ds.get(f"offload_{part}_nvme_path")
                if device == "nvme" and nvme not in (None, "none"):
                    section["nvme_path"] = nvme
                zero[f"offload_{part}"] = section
        save_16bit = ds.get("zero3_save_16bit_model")
        if save_16bit is not None:
            zero["stage3_gather_16bit_weights_on_model_save"] = _truthy(save_16bit)
        accumulation = ds.get("gradient_accumulation_steps", "auto")
        config: dict[str, Any] = {
            "train_batch_size": "auto",
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": _number_or_auto(accumulation),
            "zero_optimization": zero,
        }
        clipping = ds.get("gradient_clipping", "auto")
        if clipping not in (None, 0, "0"):
            config["gradient_clipping"] = _number_or_auto(clipping)
        return config

    def with_config_file(self, config_path: str, world_size: int) -> AccelerateLaunch:
        """This launch with a YAML naming ``config_path`` as its ``deepspeed_config_file`` in
        place of what that file holds (the map's DeepSpeed keys, ``mixed_precision``), and
        ``num_processes`` set to ``world_size``, as Accelerate accepts a YAML naming a
        DeepSpeed file: each experiment's launch (its own file), and the answer's."""
        settings = {k: v for k, v in self.yaml.items() if k != "mixed_precision"}
        kept = {k: v for k, v in self.deepspeed.items() if k not in FILE_FORM_REFUSES}
        kept["deepspeed_config_file"] = config_path
        settings.update(
            deepspeed_config=kept, num_processes=world_size, distributed_type="DEEPSPEED"
        )
        flags = {k: v for k, v in self.flags.items() if k not in _FOLDED_FLAGS}
        return dataclasses.replace(self, yaml=settings, flags=flags)

    def environment(self) -> dict[str, str]:
        """What ``accelerate launch`` sets for the ranks it starts with DeepSpeed
        (``prepare_deepspeed_cmd_env``), from which the script's Accelerate builds its
        DeepSpeed plugin."""
        settings = self.settings
        ds = settings["deepspeed_config"]
        from_yaml = list(dict(self.yaml.get("deepspeed_config") or {}))
        if "mixed_precision" in self.yaml and "mixed_precision" not in self.flags:
            from_yaml.append("mixed_precision")
        env = {
            "ACCELERATE_USE_DEEPSPEED": "true",
            "ACCELERATE_CONFIG_DS_FIELDS": ",".join(from_yaml).lower(),
            "ACCELERATE_MIXED_PRECISION": self.mixed_precision,
            # as accelerate launch does: the working directory importable in the ranks
            "PYTHONPATH": os.pathsep.join(
                filter(None, [os.environ.get("PYTHONPATH"), os.path.abspath(".")])
            ),
        }
        for key, variable in _ENVIRONMENT.items():
            if ds.get(key) is not None:
                value = ds[key]
                env[variable] = str(value).lower() if isinstance(value, bool) else str(value)
        if _truthy(settings.get("debug", False)):
            env["ACCELERATE_DEBUG_MODE"] = "true"
        return env

    def tuned_yaml(self) -> str:
        """This launch's YAML as text (of :meth:`with_config_file`'s: the answer's)."""
        return yaml.safe_dump(dict(self.yaml), sort_keys=True)

    def command(
        self, yaml_path: str, script: Sequence[str], script_args: Sequence[str]
    ) -> list[str]:
        """``accelerate launch --config_file YAML [kept flags] SCRIPT ARGS`` (or ``trl
        <command> --accelerate_config YAML ...``), as the user launches it."""
        if self.trl_command is not None:
            return [
                "trl",
                self.trl_command,
                "--accelerate_config",
                yaml_path,
                *self.kept_args,
                *script_args,
            ]
        return [
            "accelerate",
            "launch",
            "--config_file",
            yaml_path,
            *self.kept_args,
            *script,
            *script_args,
        ]


def with_precision(config: Mapping[str, Any], mixed_precision: str) -> dict[str, Any]:
    """``config`` with Accelerate's ``mixed_precision`` in it, as its DeepSpeed plugin adds it
    (a ``bf16``/``fp16`` section where the config has none).

    Raises:
        LaunchError: ``fp8``, or a precision the config's other dtype contradicts.
    """
    result = dict(config)
    if mixed_precision in ("no", ""):
        return result
    if mixed_precision not in _PRECISION_SECTIONS:
        raise LaunchError(
            f"mixed_precision {mixed_precision!r} cannot be tuned on DeepSpeed here: use 'no', "
            "'bf16' or 'fp16'"
        )
    other = "fp16" if mixed_precision == "bf16" else "bf16"
    if str(dict(result.get(other) or {}).get("enabled", False)).lower() == "true":
        raise LaunchError(
            f"mixed_precision {mixed_precision!r} contradicts the DeepSpeed config's "
            f"{other}.enabled: true (Accelerate refuses the two together)"
        )
    for key, section in _PRECISION_SECTIONS[mixed_precision].items():
        result.setdefault(key, dict(section))
    return result


def parse_accelerate_launch(argv: Sequence[str]) -> tuple[AccelerateLaunch, list[str]]:
    """``accelerate launch``'s arguments (after ``launch``) read with Accelerate's own parser:
    the launch, and the script's command (``["train.py", *args]`` or ``["-m", mod, *args]``).

    Raises:
        LaunchError: Accelerate is not installed, the arguments or the YAML are not
            Accelerate's, or they do not run DeepSpeed on one node.
    """
    try:
        from accelerate.commands.launch import launch_command_parser
    except ImportError as err:
        raise LaunchError(f"`accelerate launch` needs accelerate installed ({err})") from None
    parser = launch_command_parser()
    try:
        args = parser.parse_args(list(argv))
    except SystemExit:
        raise LaunchError(f"accelerate launch refuses its arguments: {' '.join(argv)}") from None
    given = set(getattr(args, "nondefault", ())) - {"training_script", "training_script_args"}
    flags = {name: getattr(args, name) for name in sorted(given)}
    launch = AccelerateLaunch(
        yaml_path=os.path.abspath(args.config_file) if args.config_file else None,
        yaml=_read_yaml(args.config_file) if args.config_file else {},
        flags={k: v for k, v in flags.items() if k not in ("config_file", "module")},
        kept_args=tuple(_kept_args(parser, argv, args.training_script)),
    )
    _check_launch(launch)
    script = ["-m", args.training_script] if args.module else [args.training_script]
    return launch, [*script, *args.training_script_args]


def parse_trl_command(argv: Sequence[str]) -> tuple[AccelerateLaunch, list[str]]:
    """``trl <command> ARGS`` as TRL's command line splits them: the script's own arguments
    (its parser's) and the rest, ``accelerate launch``'s (``--accelerate_config NAME`` a
    file or one of TRL's own YAMLs), then the launch of ``trl/scripts/<command>.py``.

    Raises:
        LaunchError: TRL is not installed, or the command is not one of its training scripts.
    """
    if not argv:
        raise LaunchError("`trl` needs a training command (sft, dpo, grpo, ...)")
    command, all_args = argv[0], list(argv[1:])
    try:
        import importlib
        import importlib.resources

        from trl.cli.accelerate_config import resolve_accelerate_config_argument
        from trl.cli.commands.training import _subtract_subsequence

        module = importlib.import_module(f"trl.scripts.{command}")
    except ImportError as err:
        raise LaunchError(f"`trl {command}` is not a TRL training command here ({err})") from None
    if not hasattr(module, "make_parser"):
        raise LaunchError(f"`trl {command}` is not a TRL training command (sft, dpo, grpo, ...)")
    parser = module.make_parser(prog=f"trl {command}")
    try:
        *_, config_remaining, cli_remaining = parser.parse_args_and_config(
            all_args, return_remaining_strings=True, separate_remaining_strings=True
        )
        launch_args = resolve_accelerate_config_argument(config_remaining + cli_remaining)
    except (ValueError, SystemExit) as err:
        raise LaunchError(f"trl {command} refuses its arguments: {err}") from None
    script_args = _subtract_subsequence(all_args, cli_remaining)
    script = str(importlib.resources.files("trl.scripts").joinpath(f"{command}.py"))
    launch, _ = parse_accelerate_launch([*launch_args, script])
    return dataclasses.replace(launch, trl_command=command), [script, *script_args]


# The launch flags that set a key of the YAML's deepspeed_config map.
_DEEPSPEED_FLAGS = (
    *FILE_FORM_REFUSES,
    "deepspeed_config_file",
    "zero3_init_flag",
    "deepspeed_hostfile",
    "deepspeed_exclusion_filter",
    "deepspeed_inclusion_filter",
    "deepspeed_multinode_launcher",
    "deepspeed_moe_layer_cls_names",
)


def _read_yaml(path: str) -> dict[str, Any]:
    """The YAML as written, once Accelerate's own loader has accepted it (its keys, its
    ``distributed_type``), as ``accelerate launch`` would."""
    from accelerate.commands.config.config_args import load_config_from_file

    if not os.path.isfile(path):
        raise LaunchError(f"{path}: Accelerate config file not found")
    try:
        load_config_from_file(path)
        with open(path, encoding="utf-8") as file:
            data = yaml.safe_load(file)
    except (OSError, yaml.YAMLError, ValueError, TypeError) as err:
        raise LaunchError(f"{path}: Accelerate refuses it: {err}") from None
    if not isinstance(data, dict):
        raise LaunchError(f"{path}: an Accelerate config is a YAML mapping")
    return data


def _check_launch(launch: AccelerateLaunch) -> None:
    where = launch.yaml_path or "accelerate launch"
    kind = str(launch.settings.get("distributed_type", "NO")).upper()
    if kind != "DEEPSPEED":
        raise LaunchError(
            f"{where}: distributed_type is {kind}, not DEEPSPEED: autotune tunes DeepSpeed "
            "(use a YAML with distributed_type: DEEPSPEED, or --use_deepspeed)"
        )
    if int(launch.settings.get("num_machines") or 1) > 1:
        raise LaunchError(
            f"{where}: num_machines > 1: autotune places the ranks on its own Ray cluster "
            "(--ray-address); tune with the YAML of one machine and --world-size N"
        )
    if launch.flags.get("no_python"):
        raise LaunchError("accelerate launch --no_python: autotune runs Python scripts only")
    if launch.config_file is not None:
        refused = [key for key in FILE_FORM_REFUSES if key in launch.deepspeed]
        if "mixed_precision" in launch.yaml and "mixed_precision" not in launch.flags:
            refused.append("mixed_precision")
        if refused:
            raise LaunchError(
                f"{where}: with deepspeed_config_file, Accelerate refuses {', '.join(refused)} "
                "in the YAML: set them in the DeepSpeed config file instead"
            )


def _kept_args(parser: Any, argv: Sequence[str], script: str) -> list[str]:
    """The launch's own tokens before the script, less the folded flags (see
    :data:`_FOLDED_FLAGS`), as written."""
    actions = parser._option_string_actions  # argparse keeps no public map of options
    kept: list[str] = []
    index = 0
    tokens = list(argv)
    while index < len(tokens) and tokens[index] != script:
        token = tokens[index]
        name, has_value = token.split("=", 1)[0], "=" in token
        action = actions.get(name)
        takes = 0 if has_value or action is None or action.nargs == 0 else 1
        words = tokens[index : index + 1 + takes]
        if action is None or action.dest not in _FOLDED_FLAGS:
            kept += words
        index += 1 + takes
    return kept


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes")


def _number_or_auto(value: Any) -> Any:
    if isinstance(value, int | float) or value == "auto":
        return value
    text = str(value)
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text
