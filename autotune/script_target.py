"""What to run in script mode: the user's own training script, its arguments, and how the
experiment's config is mapped onto those arguments.

``autotune run -- train.py --deepspeed ds_config.json --per_device_train_batch_size 4`` tunes
``train.py`` as it is: each experiment runs it inside the rank processes, with the candidate
config replacing the script's inside ``initialize()`` and ``autotuning.arg_mappings`` rewriting
the script's own flags (so its data loader uses the candidate's micro-batch). Torch-free: the
driver, the results directory and the fingerprint use it without importing torch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.accelerate_launch import (
    LAUNCH_CONFIG_NAME,
    AccelerateLaunch,
    LaunchError,
    with_precision,
)
from autotune.config.keys import get_key

# Flags DeepSpeed scripts take their config file from (``deepspeed.add_config_arguments``
# adds ``--deepspeed_config``; HF Trainer scripts take ``--deepspeed PATH``).
CONFIG_FLAGS = ("--deepspeed_config", "--deepspeed")
# The key LLaMA-Factory's YAML (and its ``key=value`` overrides) names the config file by.
CONFIG_KEY = "deepspeed"
# The HF Trainer's flag for the micro-batch, which the tuner searches: mapped by default where
# the script is known to take it (TRL's scripts, LLaMA-Factory, an Accelerate-launched script
# that passes it), unless autotuning.arg_mappings says otherwise. The accumulation is not: an
# "auto" one stays the script's own (its client fills it in), not the tuner's default of 1.
HF_ARG_MAPPINGS = (("train_micro_batch_size_per_gpu", "--per_device_train_batch_size"),)
# Launchers that start ranks themselves: autotune starts them, so it refuses to nest one.
_NESTED_LAUNCHERS = ("torchrun", "deepspeed", "torch.distributed.run", "torch.distributed.launch")


class ScriptError(ValueError):
    """The script cannot be run as given (missing file, unknown module, bad arguments)."""


@dataclass(frozen=True)
class ScriptTarget:
    """A training script to tune, as the user would launch it.

    Attributes:
        path: the script file (absolute), or for ``-m module`` the module's source file.
        module: for ``python -m module``: the module's name (``path`` is then its file).
        args: the script's arguments as given on the command line.
        arg_mappings: ``(config key, script flag)`` pairs from ``autotuning.arg_mappings``:
            each experiment sets the flag to the candidate's value of the key.
        accelerate: the script as ``accelerate launch`` (or ``trl <command>``) starts it: the
            launch's YAML and flags (see :mod:`autotune.accelerate_launch`).
        key_value: the script's arguments are LLaMA-Factory's: a YAML first (whose
            ``deepspeed:`` names the config), then ``key=value`` overrides; a mapping's flag
            ``--name`` is set as ``name=VALUE``.
    """

    path: str
    module: str | None = None
    args: tuple[str, ...] = ()
    arg_mappings: tuple[tuple[str, str], ...] = ()
    accelerate: AccelerateLaunch | None = None
    key_value: bool = False

    @classmethod
    def from_command(
        cls, command: Sequence[str], arg_mappings: Mapping[str, str] | None = None
    ) -> ScriptTarget:
        """``["train.py", *args]`` or ``["-m", "pkg.train", *args]``, checked to exist; or the
        script of ``["accelerate", "launch", ...]`` / ``["trl", "sft", ...]``, as they start it.

        Raises:
            ScriptError: no script given, the file does not exist, the module is not found, a
                launcher that starts ranks itself, a launch that is not DeepSpeed's.
        """
        if not command:
            raise ScriptError("no script given after `--`")
        mappings = _mapping_pairs(arg_mappings or {})
        launch, command = _launched(command)
        if command[0] == "-m":
            if len(command) < 2:
                raise ScriptError("`-m` needs a module name")
            module = command[1]
            target = cls(_module_file(module), module, tuple(command[2:]), mappings, launch)
        else:
            path = os.path.abspath(command[0])
            if not os.path.isfile(path):
                raise ScriptError(f"script {command[0]!r} does not exist")
            target = cls(path, None, tuple(command[1:]), mappings, launch)
        return target._as_llamafactory()

    def _as_llamafactory(self) -> ScriptTarget:
        """LLaMA-Factory's form where the first argument is a YAML (its launcher reads the
        rest as ``key=value`` overrides); refused under ``FORCE_TORCHRUN``, which makes its
        ``llamafactory-cli train`` start torchrun inside every rank."""
        first = self.args[0] if self.args else ""
        llamafactory = first.endswith((".yaml", ".yml")) and os.path.isfile(first)
        if not llamafactory and not (self.module or "").startswith("llamafactory"):
            return self
        for variable in ("FORCE_TORCHRUN", "USE_MCA"):
            if os.environ.get(variable, "0").lower() in ("true", "y", "1"):
                raise ScriptError(
                    f"{variable} is set: LLaMA-Factory would start torchrun inside each rank, "
                    "but autotune starts the ranks itself: unset it and give the world size "
                    "with --world-size N"
                )
        return dataclasses.replace(self, key_value=llamafactory)

    def with_arg_mappings(self, arg_mappings: Mapping[str, str]) -> ScriptTarget:
        """The same script with ``arg_mappings`` (``autotuning.arg_mappings``, known only once
        the config is loaded), without finding its file again; none given, the HF Trainer's
        flags where the script is known to take them (see :data:`HF_ARG_MAPPINGS`)."""
        pairs = _mapping_pairs(arg_mappings) or self._known_arg_mappings()
        return dataclasses.replace(self, arg_mappings=pairs)

    def _known_arg_mappings(self) -> tuple[tuple[str, str], ...]:
        if self.key_value or (self.accelerate and self.accelerate.trl_command):
            return HF_ARG_MAPPINGS
        if self.accelerate is not None:  # a script of its own: the flags it is given
            return tuple(
                (key, flag) for key, flag in HF_ARG_MAPPINGS if flag_value(self.args, [flag])
            )
        return ()

    def left_to_client(
        self, spec: Mapping[str, Any], overrides: Mapping[str, Any]
    ) -> dict[str, Any]:
        """``overrides`` (the winner's values) less those the training command hands the
        client through a mapped argument where the user wrote ``"auto"`` and the client is
        known to fill ``"auto"`` in (the HF Trainer under an Accelerate launch, TRL,
        LLaMA-Factory): the winner's file keeps ``"auto"`` there, so that changing the
        argument later still passes DeepSpeed's own check of the batch sizes."""
        if self.accelerate is None and not self.key_value:
            return dict(overrides)
        carried = {key for key, _ in self.arg_mappings if get_key(spec, key) == "auto"}
        return {key: value for key, value in overrides.items() if key not in carried}

    @property
    def world_size(self) -> int | None:
        """The ranks the launch asks for (``num_processes``), if it says."""
        return self.accelerate.num_processes if self.accelerate else None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ScriptTarget:
        """The target as ``dataclasses.asdict`` wrote it (lists for tuples)."""
        accelerate = data.get("accelerate")
        return cls(
            path=data["path"],
            module=data.get("module"),
            args=tuple(data.get("args", ())),
            arg_mappings=tuple((key, flag) for key, flag in data.get("arg_mappings", ())),
            accelerate=AccelerateLaunch.from_dict(accelerate) if accelerate else None,
            key_value=bool(data.get("key_value", False)),
        )

    @property
    def label(self) -> str:
        """How summaries name it: ``train.py`` or ``-m pkg.train`` (``accelerate launch
        train.py``, ``trl sft`` where launched so)."""
        name = f"-m {self.module}" if self.module else os.path.basename(self.path)
        if self.accelerate is None:
            return name
        if self.accelerate.trl_command:
            return f"trl {self.accelerate.trl_command}"
        return f"accelerate launch {name}"

    def config_path(self) -> str | None:
        """The config file the script's own arguments point at, if any (for LLaMA-Factory's
        form: the last ``deepspeed=FILE``, else its YAML's ``deepspeed:``; for an
        Accelerate launch: the YAML's ``deepspeed_config_file``)."""
        if self.key_value:
            found = key_value(self.args, CONFIG_KEY)
            return found if found is not None else _yaml_key(self.args[0], CONFIG_KEY)
        if self.accelerate is not None:
            return flag_value(self.args, CONFIG_FLAGS) or self.accelerate.config_file
        return flag_value(self.args, CONFIG_FLAGS)

    def launch_config(self) -> dict[str, Any] | None:
        """The DeepSpeed config an Accelerate launch's ``deepspeed_config`` map stands for,
        where no file holds it (see :meth:`AccelerateLaunch.map_config`); else None."""
        if self.accelerate is None or self.config_path() is not None:
            return None
        return self.accelerate.map_config()

    def with_launch_settings(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """``spec`` with what the launch adds to the config the script's client reads (an
        Accelerate launch's ``mixed_precision``, as its plugin adds it).

        Raises:
            ScriptError: the launch's precision contradicts the config.
        """
        if self.accelerate is None:
            return dict(spec)
        try:
            return with_precision(spec, self.accelerate.mixed_precision)
        except LaunchError as err:
            raise ScriptError(f"{self.config_label()}: {err}") from None

    def config_label(self) -> str:
        """How errors name where the config came from."""
        found = self.config_path()
        if found is not None:
            return found
        if self.accelerate is not None and self.accelerate.yaml_path is not None:
            return f"{self.accelerate.yaml_path}'s deepspeed_config"
        return "accelerate launch's DeepSpeed flags" if self.accelerate else self.label

    def script_command(self) -> list[str]:
        """How Python runs the script itself: ``[path]`` or ``["-m", module]``."""
        return ["-m", self.module] if self.module else [self.path]

    def environment(self, config_path: str | None, world_size: int) -> dict[str, str]:
        """The environment a launcher gives the script for the config at ``config_path``:
        for an Accelerate launch, what ``accelerate launch`` sets (the launch's own config
        where None); nothing otherwise."""
        if self.accelerate is None:
            return {}
        launch = self.accelerate
        if config_path is not None:
            launch = launch.with_config_file(config_path, world_size)
        return launch.environment()

    def command(
        self, ds_config: Mapping[str, Any], config_path: str, launcher: Sequence[str]
    ) -> list[str]:
        """The command that trains with ``ds_config`` at ``config_path``, in the script's own
        form: its mapped arguments set to ``ds_config``'s values and its config argument
        naming ``config_path`` (``--deepspeed FILE`` / ``--deepspeed_config FILE`` as it has
        one, ``deepspeed=FILE`` for LLaMA-Factory's form, ``--deepspeed_config`` added where it
        had none), under ``launcher`` (that of the engine that measured it,
        ``MeasuringEngine.launcher``). An Accelerate launch is its own launcher: ``accelerate
        launch --config_file Y`` with the YAML :func:`launch_yaml_path` names beside
        ``config_path`` (under ``autotune exec``, which starts it on the built-in engine)."""
        argv = self.argv(ds_config, config_path)[1:]
        if self.accelerate is not None:
            own = self.accelerate.command(
                launch_yaml_path(config_path), self.script_command(), argv
            )
            return [*launcher, *own] if launcher[:2] == ["autotune", "exec"] else own
        if self.adds_config_argument():
            argv += ["--deepspeed_config", config_path]
        return [*launcher, *self.script_command(), *argv]

    def adds_config_argument(self) -> bool:
        """Whether :meth:`command` gives the script a config argument its experiments did
        not have (``--deepspeed_config``: it names no config file of its own)."""
        return self.accelerate is None and not self.key_value and config_flag(self.args) is None

    def file_hash(self) -> str:
        """sha256 of the script's file: a changed script is a different tuning job."""
        with open(self.path, "rb") as source:
            return hashlib.sha256(source.read()).hexdigest()

    def argv(self, ds_config: Mapping[str, Any], config_path: str | None = None) -> list[str]:
        """The script's ``sys.argv`` for an experiment of ``ds_config``.

        Every mapped key present in ``ds_config`` (and not ``"auto"``) sets its flag: an
        existing ``--flag VALUE`` or ``--flag=VALUE`` is rewritten, a missing one appended.
        With ``config_path``, the script's own config argument (``--deepspeed_config`` or the
        HF Trainer's ``--deepspeed`` with a value) names that file instead, as DeepSpeed's
        autotuner gives each experiment its own config file.

        Example:
            >>> target = ScriptTarget("/t.py", None, ("--deepspeed", "ds.json", "--bs", "1"),
            ...                       (("train_micro_batch_size_per_gpu", "--bs"),))
            >>> target.argv({"train_micro_batch_size_per_gpu": 8}, "exp/ds_config.json")
            ['/t.py', '--deepspeed', 'exp/ds_config.json', '--bs', '8']
        """
        args = list(self.args)
        for key, flag in self.arg_mappings:
            value = config_value(ds_config, key)
            if value is None or value == "auto":
                continue
            if self.key_value:
                args = set_key_value(args, flag.lstrip("-"), _flag_text(value))
            else:
                args = set_flag(args, flag, _flag_text(value))
        if config_path is not None and self.key_value:
            return [self.path, *set_key_value(args, CONFIG_KEY, config_path)]
        own = config_flag(args)
        if config_path is not None and own is not None:
            args = set_flag(args, own, config_path)
        return [self.path, *args]

    def fingerprint(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "script": self.path,
            "module": self.module,
            "args": list(self.args),
            "arg_mappings": dict(self.arg_mappings),
            "sha256": self.file_hash(),
        }
        if self.accelerate is not None:
            found["accelerate"] = {"yaml": dict(self.accelerate.yaml), **self.accelerate.flags}
        return found


def flag_value(args: Sequence[str], flags: Sequence[str]) -> str | None:
    """The value of the first of ``flags`` (in that order) in ``args`` (``--f V`` or
    ``--f=V``), or None.

    A flag followed by another option has no value: DeepSpeed's own launch line is
    ``--deepspeed --deepspeed_config ds.json``, where ``--deepspeed`` is a bare switch.
    """
    for flag in flags:
        for index, arg in enumerate(args):
            if arg == flag and index + 1 < len(args) and not args[index + 1].startswith("-"):
                return args[index + 1]
            if arg.startswith(flag + "="):
                return arg[len(flag) + 1 :]
    return None


def config_flag(args: Sequence[str]) -> str | None:
    """The flag of ``args`` that names a config file (see :data:`CONFIG_FLAGS`), if any."""
    return next((flag for flag in CONFIG_FLAGS if flag_value(args, (flag,)) is not None), None)


def set_flag(args: Sequence[str], flag: str, value: str) -> list[str]:
    """``args`` with every ``flag`` set to ``value``, or ``flag value`` appended."""
    result, found, index = [], False, 0
    while index < len(args):
        arg = args[index]
        if arg == flag and index + 1 < len(args):
            result += [flag, value]
            found, index = True, index + 2
            continue
        if arg.startswith(flag + "="):
            result.append(f"{flag}={value}")
            found = True
        else:
            result.append(arg)
        index += 1
    return result if found else [*result, flag, value]


def key_value(args: Sequence[str], key: str) -> str | None:
    """The value of the last ``key=VALUE`` in ``args`` (LLaMA-Factory's overrides), or None."""
    found = [arg.split("=", 1)[1] for arg in args if arg.startswith(f"{key}=")]
    return found[-1] if found else None


def set_key_value(args: Sequence[str], key: str, value: str) -> list[str]:
    """``args`` with every ``key=...`` set to ``value``, or ``key=value`` appended.

    Example:
        >>> set_key_value(["cfg.yaml", "deepspeed=a.json"], "deepspeed", "b.json")
        ['cfg.yaml', 'deepspeed=b.json']
    """
    found = any(arg.startswith(f"{key}=") for arg in args)
    result = [f"{key}={value}" if arg.startswith(f"{key}=") else arg for arg in args]
    return result if found else [*result, f"{key}={value}"]


def launch_yaml_path(config_path: str) -> str:
    """Where the Accelerate YAML that names ``config_path`` is written: beside it."""
    return os.path.join(os.path.dirname(config_path), LAUNCH_CONFIG_NAME)


def config_value(ds_config: Mapping[str, Any], key: str) -> Any:
    """``key`` of ``ds_config``: a dotted path, a top-level key, or (as DeepSpeed looks
    mapped keys up) the first nested key of that name."""
    node = get_key(ds_config, key)
    if node is not None or "." in key:
        return node
    for value in ds_config.values():
        if isinstance(value, Mapping):
            found = config_value(value, key)
            if found is not None:
                return found
    return None


def _mapping_pairs(arg_mappings: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple((key.strip(), flag.strip()) for key, flag in arg_mappings.items())


def _flag_text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _launched(command: Sequence[str]) -> tuple[AccelerateLaunch | None, list[str]]:
    """The launch and the script's own command where ``command`` starts with a launcher
    autotune reads (``accelerate launch``, ``trl <command>``); ``(None, command)`` otherwise.

    Raises:
        ScriptError: a launcher that starts ranks itself (torchrun, deepspeed,
            ``llamafactory-cli train``), or a launch autotune cannot tune.
    """
    from autotune.accelerate_launch import parse_accelerate_launch, parse_trl_command

    head = os.path.basename(command[0])
    module = command[1] if command[0] == "-m" and len(command) > 1 else None
    try:
        if (head == "accelerate" and command[1:2] == ["launch"]) or head == "accelerate-launch":
            skip = 2 if head == "accelerate" else 1
            return parse_accelerate_launch(command[skip:])
        if module == "accelerate.commands.launch":
            return parse_accelerate_launch(command[2:])
        if head == "trl":
            return parse_trl_command(command[1:])
    except LaunchError as err:
        raise ScriptError(str(err)) from None
    if head in _NESTED_LAUNCHERS or module in _NESTED_LAUNCHERS:
        raise ScriptError(
            f"{head if module is None else module} starts the ranks itself, and so does "
            "autotune: give the script alone and the world size with --world-size N "
            "(autotune run -n N -- train.py ARGS)"
        )
    if head in ("llamafactory-cli", "lmf"):
        raise ScriptError(
            f"{head} starts its own launcher: give LLaMA-Factory's training entry as a module "
            "instead: autotune run -- -m llamafactory.launcher CONFIG.yaml [key=value ...]"
        )
    return None, list(command)


def yaml_config_advice(path: str | os.PathLike[str]) -> str:
    """What to do with a YAML given where a DeepSpeed JSON config goes (``-c``)."""
    data = _read_yaml(path)
    if "distributed_type" in data:
        return (
            "an Accelerate config, not a DeepSpeed JSON: tune the script as Accelerate "
            f"launches it: autotune run -- accelerate launch --config_file {path} SCRIPT ARGS"
        )
    if CONFIG_KEY in data:
        return (
            "a LLaMA-Factory config, not a DeepSpeed JSON: give it to its training entry: "
            f"autotune run -- -m llamafactory.launcher {path} [key=value ...]"
        )
    return "a YAML file: -c takes a DeepSpeed JSON config"


def _read_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The YAML mapping at ``path``; empty where it is none."""
    import yaml

    try:
        with open(path, encoding="utf-8") as file:
            data = yaml.safe_load(file)
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _yaml_key(path: str, key: str) -> str | None:
    """``key`` of the YAML mapping at ``path`` (as text), or None."""
    value = _read_yaml(path).get(key)
    return str(value) if value is not None else None


def _module_file(module: str) -> str:
    import sys

    # As ``python -m`` does, the working directory comes first on the import path.
    sys.path.insert(0, os.getcwd())
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as err:
        raise ScriptError(f"module {module!r} cannot be found: {err}") from None
    finally:
        sys.path.remove(os.getcwd())
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        raise ScriptError(f"module {module!r} cannot be found (is its package on sys.path?)")
    if spec.submodule_search_locations is not None:  # a package: runpy runs its __main__
        main = os.path.join(os.path.dirname(spec.origin), "__main__.py")
        if not os.path.isfile(main):
            raise ScriptError(f"package {module!r} has no __main__.py to run")
        return main
    return spec.origin
