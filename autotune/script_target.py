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

from autotune.config.keys import get_key

# Flags DeepSpeed scripts take their config file from (``deepspeed.add_config_arguments``
# adds ``--deepspeed_config``; HF Trainer scripts take ``--deepspeed PATH``).
CONFIG_FLAGS = ("--deepspeed_config", "--deepspeed")


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
    """

    path: str
    module: str | None = None
    args: tuple[str, ...] = ()
    arg_mappings: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_command(
        cls, command: Sequence[str], arg_mappings: Mapping[str, str] | None = None
    ) -> ScriptTarget:
        """``["train.py", *args]`` or ``["-m", "pkg.train", *args]``, checked to exist.

        Raises:
            ScriptError: no script given, the file does not exist, the module is not found.
        """
        if not command:
            raise ScriptError("no script given after `--`")
        mappings = _mapping_pairs(arg_mappings or {})
        if command[0] == "-m":
            if len(command) < 2:
                raise ScriptError("`-m` needs a module name")
            module = command[1]
            return cls(_module_file(module), module, tuple(command[2:]), mappings)
        path = os.path.abspath(command[0])
        if not os.path.isfile(path):
            raise ScriptError(f"script {command[0]!r} does not exist")
        return cls(path, None, tuple(command[1:]), mappings)

    def with_arg_mappings(self, arg_mappings: Mapping[str, str]) -> ScriptTarget:
        """The same script with ``arg_mappings`` (``autotuning.arg_mappings``, known only once
        the config is loaded), without finding its file again."""
        return dataclasses.replace(self, arg_mappings=_mapping_pairs(arg_mappings))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ScriptTarget:
        """The target as ``dataclasses.asdict`` wrote it (lists for tuples)."""
        return cls(
            path=data["path"],
            module=data.get("module"),
            args=tuple(data.get("args", ())),
            arg_mappings=tuple((key, flag) for key, flag in data.get("arg_mappings", ())),
        )

    @property
    def label(self) -> str:
        """How summaries name it: ``train.py`` or ``-m pkg.train``."""
        return f"-m {self.module}" if self.module else os.path.basename(self.path)

    def config_path(self) -> str | None:
        """The config file the script's own arguments point at, if any."""
        return flag_value(self.args, CONFIG_FLAGS)

    def command(
        self, ds_config: Mapping[str, Any], config_path: str, launcher: Sequence[str]
    ) -> list[str]:
        """The command that trains with ``ds_config``: the script under ``launcher`` (that of
        the engine that measured it, ``MeasuringEngine.launcher``), its mapped flags set to
        ``ds_config``'s values and its config argument naming ``config_path`` (added as
        ``--deepspeed_config`` where it had none)."""
        argv = self.argv(ds_config, config_path)[1:]
        if config_flag(argv) is None:
            argv += ["--deepspeed_config", config_path]
        script = ["-m", self.module] if self.module else [self.path]
        return [*launcher, *script, *argv]

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
            args = set_flag(args, flag, _flag_text(value))
        own = config_flag(args)
        if config_path is not None and own is not None:
            args = set_flag(args, own, config_path)
        return [self.path, *args]

    def fingerprint(self) -> dict[str, Any]:
        return {
            "script": self.path,
            "module": self.module,
            "args": list(self.args),
            "arg_mappings": dict(self.arg_mappings),
            "sha256": self.file_hash(),
        }


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
