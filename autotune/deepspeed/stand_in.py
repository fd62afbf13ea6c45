"""autotune standing in for DeepSpeed inside the processes that run a user's script.

transformers, Accelerate and Lightning decide whether DeepSpeed is there once, when they are
first imported (or first ask), from ``importlib.util.find_spec("deepspeed")`` and
``importlib.metadata`` (a ``deepspeed`` distribution: 0.9.3 or later for transformers and
Accelerate, 0.16.0 or later for Lightning under torch 2.6+), and import its names as they need
them. While standing in:

- ``sys.modules`` holds :mod:`autotune.deepspeed` and every served module under DeepSpeed's
  names (``deepspeed``, ``deepspeed.comm``, ``deepspeed.runtime.lr_schedules``, ...);
- a meta-path finder answers ``importlib.metadata`` with a ``deepspeed`` distribution of the
  version served (:data:`autotune.deepspeed.__version__`), and refuses any other
  ``deepspeed.*`` module with an error that names it, so a real DeepSpeed installed alongside
  is never half-imported underneath;
- on a machine without CUDA, Accelerate's ``PartialState`` is told the ranks talk over gloo
  (see :func:`_let_accelerate_see_the_cpu_group`).

Nothing is written to site-packages, and outside :func:`standing_in` (or a process started by
``python -m autotune.launch``) a real DeepSpeed is what ``import deepspeed`` finds.

Clients imported in this process while autotune did not stand in have already decided
DeepSpeed is absent: :func:`standing_in` drops them (and TRL and PEFT, built on them) from
``sys.modules`` so the script imports them again (and keeps those imported while standing in
between runs, so a warm rank pays the import once).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import autotune.deepspeed as served

NAME = "deepspeed"
# The clients whose import decides for good whether DeepSpeed is there (Lightning caches its
# answer), and those built on them (TRL and PEFT subclass transformers' classes: they go with it).
CLIENTS = (
    "transformers",
    "accelerate",
    "trl",
    "peft",
    "pytorch_lightning",
    "lightning_fabric",
    "lightning",
)
# Client modules imported while standing in, so still right to reuse (see _forget_clients).
_imported_standing_in: set[str] = set()


class _StandInDistribution(importlib.metadata.Distribution):
    """The ``deepspeed`` distribution ``importlib.metadata`` finds while autotune stands in."""

    def read_text(self, filename: str) -> str | None:
        if filename == "METADATA":
            return (
                "Metadata-Version: 2.1\n"
                f"Name: {NAME}\n"
                f"Version: {served.__version__}\n"
                "Summary: autotune's built-in ZeRO engine, standing in for DeepSpeed "
                f"{served.SERVED_VERSION}'s API\n"
            )
        return None

    def locate_file(self, path: str | os.PathLike[str]) -> Path:
        return Path(served.__file__).parent / path


class _StandInFinder(importlib.abc.MetaPathFinder):
    """Answers for ``deepspeed``: its distribution, and no module autotune does not serve."""

    def find_spec(
        self, fullname: str, path: Any = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == NAME or fullname.startswith(f"{NAME}."):
            # Served modules are in sys.modules already; this one is not served.
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: DeepSpeed's {fullname} is not served by "
                "autotune's built-in engine",
                name=fullname,
            )
        return None

    def find_distributions(
        self, context: importlib.metadata.DistributionFinder.Context | None = None
    ) -> Iterator[importlib.metadata.Distribution]:
        name = getattr(context, "name", None)
        if name is None or re.sub(r"[-_.]+", "-", name).lower() == NAME:
            yield _StandInDistribution()


_FINDER = _StandInFinder()


def served_modules() -> dict[str, ModuleType]:
    """Every served module under DeepSpeed's name (imports them: torch and the engine)."""
    modules: dict[str, ModuleType] = {NAME: served}
    for name in served.SERVED_MODULES:
        modules[f"{NAME}.{name}"] = importlib.import_module(f"{served.__name__}.{name}")
    return modules


def install() -> None:
    """Stand in for DeepSpeed in this process for good (``python -m autotune.launch``)."""
    _forget_clients()
    sys.modules.update(served_modules())
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    _let_accelerate_see_the_cpu_group()


@contextlib.contextmanager
def standing_in() -> Iterator[None]:
    """Stand in for DeepSpeed inside the block: one script's run in a warm rank process.

    What ``deepspeed`` names in ``sys.modules`` and ``sys.meta_path`` come back as they were
    after the block, and so does the level of DeepSpeed's logger; Accelerate's process-wide
    state (its ``PartialState`` singleton, set up by this run's process group) is reset for the
    next run.
    """
    _forget_clients()
    aliases = served_modules()
    saved = {name: sys.modules.get(name) for name in aliases}
    # Clients set DeepSpeed's log level (Lightning, the Trainer); it is this run's only.
    log_level = served.utils.logger.level
    sys.modules.update(aliases)
    sys.meta_path.insert(0, _FINDER)
    _let_accelerate_see_the_cpu_group()
    try:
        yield
    finally:
        for finder in (_FINDER, _ACCELERATE_HOOK):
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(finder)
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        _imported_standing_in.update(m for m in sys.modules if _is_client(m))
        reset_accelerate()
        served.utils.logger.setLevel(log_level)


def _is_client(module: str) -> bool:
    return module.split(".", 1)[0] in CLIENTS


def _forget_clients() -> None:
    """Drop the clients from ``sys.modules`` if any of them was imported while autotune did
    not stand in: they decided then that DeepSpeed is absent, for good."""
    loaded = [m for m in sys.modules if _is_client(m)]
    if all(m in _imported_standing_in for m in loaded):
        return
    for module in loaded:
        del sys.modules[module]
    _imported_standing_in.clear()


def reset_accelerate() -> None:
    """Forget Accelerate's process-wide state, which names the run's (now destroyed) group."""
    state = sys.modules.get("accelerate.state")
    if state is not None:
        state.AcceleratorState._reset_state(reset_partial_state=True)
        state.GradientState._reset_state()


def _let_accelerate_see_the_cpu_group() -> None:
    """On a machine without CUDA, make Accelerate's DeepSpeed runs see the gloo group.

    Accelerate picks its backend from the device it finds; for DeepSpeed it has no CPU branch
    (its gloo branch is for ``cpu=True``, which turns DeepSpeed off), so with neither it
    leaves the backend unset and counts every rank as a world of one: each rank would train on
    all the data alone, the Trainer would save from every rank, and a gather would fail. Its
    ``PartialState._prepare_backend`` is wrapped, now or when ``accelerate.state`` is first
    imported, to answer gloo where it found no backend for a DeepSpeed run under a launcher.
    """
    import torch

    if torch.cuda.is_available():
        return
    state = sys.modules.get("accelerate.state")
    if state is not None:
        _wrap_prepare_backend(state)
    elif _ACCELERATE_HOOK not in sys.meta_path:
        sys.meta_path.insert(0, _ACCELERATE_HOOK)


def _wrap_prepare_backend(state: ModuleType) -> None:
    partial = state.PartialState
    original = partial._prepare_backend
    if getattr(original, "_autotune_cpu_group", False):
        return

    @functools.wraps(original)
    def prepare_backend(self: Any, cpu: bool = False, *args: Any, **kwargs: Any) -> Any:
        backend, distributed_type = original(self, cpu, *args, **kwargs)
        deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
        launched = int(os.environ.get("LOCAL_RANK", "-1")) != -1
        if backend is None and not cpu and deepspeed and launched:
            return "gloo", state.DistributedType.MULTI_CPU
        return backend, distributed_type

    prepare_backend._autotune_cpu_group = True  # type: ignore[attr-defined]
    partial._prepare_backend = prepare_backend


class _AfterImport(importlib.abc.MetaPathFinder):
    """Wraps Accelerate's backend choice right after ``accelerate.state`` is imported."""

    def find_spec(
        self, fullname: str, path: Any = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "accelerate.state":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        execute = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            _wrap_prepare_backend(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_ACCELERATE_HOOK = _AfterImport()
