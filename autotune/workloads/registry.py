"""Turning a workload spec (``gpt``, ``hf:bert``, ``package.module:function``) into a Workload."""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import re
import sys
import typing
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from autotune.workloads.args import WorkloadError, did_you_mean
from autotune.workloads.base import Workload
from autotune.workloads.gpt import build_gpt
from autotune.workloads.hf import HF_PREFIX, build_hf, build_hf_gpt2
from autotune.workloads.mlp import build_mlp

BUILTIN_WORKLOADS: dict[str, Callable[..., Workload]] = {
    "gpt": build_gpt,
    "mlp": build_mlp,
    "hf_gpt2": build_hf_gpt2,
}
"""Built-in workload names and their factories; they resolve exactly like user workloads."""

_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
_USER_SPEC = re.compile(rf"(?P<module>{_DOTTED}):(?P<attr>{_DOTTED})")


def _one_line(exc: BaseException) -> str:
    """``Type: message`` on one line: the message's first line, and where that only
    introduces the next (huggingface_hub's ``Validation error for field 'n_layer':``) the
    next too."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    text = lines[0] if not lines[0].endswith(":") else " ".join(lines[:2])
    return f"{type(exc).__name__}: {text}"


def _import_module(spec: str, module_name: str) -> Any:
    # A console script's sys.path starts with its own bin/ folder, not the working directory, so
    # `autotune run --workload mymodel:build` would not find ./mymodel.py (uvicorn and gunicorn
    # add it for the same reason). Appended, not prepended, so it shadows nothing installed.
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.append(cwd)
    importlib.invalidate_caches()  # modules written since the last import are found too
    try:
        return importlib.import_module(module_name)
    except Exception as exc:  # any import-time failure is the user's spec failing
        raise WorkloadError(
            f"workload {spec!r}: cannot import module {module_name!r} ({_one_line(exc)})"
        ) from exc


def find_factory(spec: str) -> Callable[..., Any]:
    """The function a workload spec names, imported but not called.

    Args:
        spec: A built-in name (``"gpt"``), ``"hf:<model_type>"`` (any ``transformers``
            architecture, built offline from its default config) or
            ``"package.module:function"``.

    Returns:
        The factory.

    Raises:
        WorkloadError: The spec is malformed, unknown, does not import, or names something
            missing or not callable.
    """
    if not isinstance(spec, str) or not spec:
        raise WorkloadError(
            f"workload {spec!r}: expected a built-in name or 'package.module:function'"
        )
    if spec.startswith(HF_PREFIX):
        model_type = spec[len(HF_PREFIX) :]
        if not model_type:
            raise WorkloadError(f"workload {spec!r}: expected hf:<model_type>, e.g. hf:bert")
        return functools.partial(build_hf, model_type)
    if ":" not in spec:
        if spec in BUILTIN_WORKLOADS:
            return BUILTIN_WORKLOADS[spec]
        raise WorkloadError(
            f"workload {spec!r}: unknown built-in workload{did_you_mean(spec, BUILTIN_WORKLOADS)}"
            f"; built-ins are {', '.join(sorted(BUILTIN_WORKLOADS))}, hf:<model_type> builds a "
            "transformers model, and a user workload is named 'package.module:function'"
        )
    match = _USER_SPEC.fullmatch(spec)
    if match is None:
        raise WorkloadError(
            f"workload {spec!r}: malformed spec; expected 'package.module:function'"
        )
    obj = _import_module(spec, match["module"])
    for part in match["attr"].split("."):
        if not hasattr(obj, part):
            raise WorkloadError(
                f"workload {spec!r}: module {match['module']!r} has no attribute {match['attr']!r}"
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise WorkloadError(
            f"workload {spec!r}: {match['attr']!r} is {type(obj).__name__}, not a function"
        )
    factory: Callable[..., Any] = obj
    return factory


def _as_workload(spec: str, result: object) -> Workload:
    expected = (
        "expected an object with .model (an nn.Module) and .make_batch(micro_batch_size, "
        "generator), or a tuple (model, make_batch)"
    )
    switch = None
    if isinstance(result, Workload):
        model, make_batch, switch = result.model, result.make_batch, result.activation_checkpointing
    elif isinstance(result, tuple):
        if len(result) != 2:
            raise WorkloadError(f"workload {spec!r}: returned a tuple of {len(result)}; {expected}")
        model, make_batch = result
    elif hasattr(result, "model") and hasattr(result, "make_batch"):
        model, make_batch = result.model, result.make_batch
    else:
        raise WorkloadError(f"workload {spec!r}: returned {type(result).__name__}; {expected}")
    if not isinstance(model, nn.Module):
        raise WorkloadError(
            f"workload {spec!r}: its model is {type(model).__name__}, not an nn.Module"
        )
    if not callable(make_batch):
        raise WorkloadError(
            f"workload {spec!r}: its make_batch is {type(make_batch).__name__}, not callable"
        )
    return Workload(model=model, make_batch=make_batch, activation_checkpointing=switch)


def check_arguments(spec: str, factory: Callable[..., Any], args: Mapping[str, Any]) -> None:
    """Each argument is one the factory takes, of the type it declares: a typo is named, with
    the closest name, and a wrong type with the expected one, rather than the factory's
    ``TypeError`` (which names neither) or a failure deep in building the model.

    Raises:
        WorkloadError: an argument the factory does not take, or of another type than its
            annotation (``n_layer: int`` given ``"four"``).
    """
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # no signature to read (a builtin): the call will say
        return
    names = [
        name
        for name, p in parameters.items()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    # A factory that takes any name (hf:<model_type>) checks them against its config itself.
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        for key in args:
            if key not in names:
                raise WorkloadError(
                    f"workload {spec!r}: no argument {key!r}{did_you_mean(key, names)}; it "
                    f"takes {', '.join(names) or 'none'}"
                )
    _check_argument_types(spec, factory, {k: v for k, v in args.items() if k in names})


def _check_argument_types(spec: str, factory: Callable[..., Any], args: Mapping[str, Any]) -> None:
    import pydantic

    target = factory.func if isinstance(factory, functools.partial) else factory
    try:
        hints = typing.get_type_hints(target)
    except Exception:  # an annotation that does not resolve: the call will say
        return
    for key, value in args.items():
        if key not in hints:
            continue
        try:
            # Strict: 4.0 is no int, "4" no number, true no int (JSON's values as given).
            pydantic.TypeAdapter(hints[key]).validate_python(value, strict=True)
        except pydantic.ValidationError:
            expected = getattr(hints[key], "__name__", None) or str(hints[key])
            raise WorkloadError(
                f"workload {spec!r}: argument {key!r} is {value!r} ({type(value).__name__}); "
                f"expected {expected}"
            ) from None
        except pydantic.PydanticSchemaGenerationError:
            continue  # a type pydantic cannot check: the call will say


def _build(spec: str, factory: Callable[..., Any], args: Mapping[str, Any], seed: int) -> Workload:
    check_arguments(spec, factory, args)
    # fork_rng: seed the initialisation without leaving the caller's global RNG changed.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            result = factory(**args)
        except WorkloadError as exc:
            raise WorkloadError(f"workload {spec!r}: {exc}") from exc
        except Exception as exc:
            raise WorkloadError(
                f"workload {spec!r}: building it failed ({_one_line(exc)})"
            ) from exc
    return _as_workload(spec, result)


def resolve_workload(
    spec: str, args: Mapping[str, Any] | None = None, *, seed: int = 0
) -> Workload:
    """Build the workload a spec names.

    Every rank calls this with the same spec, args and seed, and so builds identical weights.

    Args:
        spec: A built-in name (see ``BUILTIN_WORKLOADS``) or ``"package.module:function"``;
            the function is called with ``args`` as keyword arguments and returns a
            ``Workload``-like object (``.model``, ``.make_batch``) or a tuple
            ``(model, make_batch)``.
        args: Keyword arguments for the factory (see ``parse_workload_args``).
        seed: Seeds torch's global RNG while the factory runs; the caller's RNG state is
            restored afterwards.

    Returns:
        The workload.

    Raises:
        WorkloadError: The spec is bad, the factory raises, or it returns the wrong thing.

    Example:
        >>> wl = resolve_workload("gpt", {"n_layer": 1}, seed=0)
        >>> type(wl.model).__name__, [tuple(t.shape) for t in wl.make_batch(2, torch.Generator())]
        ('GPT', [(2, 128), (2, 128)])
    """
    factory = find_factory(spec)
    return _build(spec, factory, args or {}, seed)


def _check_forward(spec: str, workload: Workload, *, on_meta: bool) -> None:
    try:
        inputs = workload.make_batch(1, torch.Generator().manual_seed(0))
    except Exception as exc:
        raise WorkloadError(
            f"workload {spec!r}: make_batch(1, generator) failed ({_one_line(exc)})"
        ) from exc
    if not isinstance(inputs, tuple | list):
        raise WorkloadError(
            f"workload {spec!r}: make_batch returned {type(inputs).__name__}; "
            "expected a tuple of positional inputs"
        )
    if on_meta:
        inputs = tuple(x.to("meta") if isinstance(x, torch.Tensor) else x for x in inputs)
    try:
        with torch.no_grad():
            loss = workload.model(*inputs)
    except Exception as exc:
        raise WorkloadError(
            f"workload {spec!r}: forward on a micro-batch of 1 failed ({_one_line(exc)})"
        ) from exc
    if not (isinstance(loss, torch.Tensor) and loss.dim() == 0 and loss.is_floating_point()):
        got = (
            f"a {loss.dtype} tensor of shape {tuple(loss.shape)}"
            if isinstance(loss, torch.Tensor)
            else type(loss).__name__
        )
        raise WorkloadError(
            f"workload {spec!r}: forward returned {got}; expected a scalar floating-point loss"
        )


def check_workload(spec: str, args: Mapping[str, Any] | None = None, *, seed: int = 0) -> int:
    """Build a workload once, cheaply, and run one forward, to reject a bad spec early.

    The model is built and run on the meta device, so nothing is allocated; a model that does
    not work on meta (data-dependent code, tensors made on a fixed device) is tried again on
    the CPU with a micro-batch of 1.

    Args:
        spec: As for ``resolve_workload``.
        args: As for ``resolve_workload``.
        seed: As for ``resolve_workload``.

    Returns:
        The model's number of parameters.

    Raises:
        WorkloadError: Anything ``resolve_workload`` rejects, a ``make_batch`` that fails or
            returns no tuple, or a forward that fails or returns no scalar loss.
    """
    factory = find_factory(spec)
    args = args or {}
    try:
        with torch.device("meta"):
            workload = _build(spec, factory, args, seed)
        _check_forward(spec, workload, on_meta=True)
    except WorkloadError as exc:
        # No __cause__: our own check of the result failed, which the CPU would repeat.
        if exc.__cause__ is None:
            raise
        workload = _build(spec, factory, args, seed)
        _check_forward(spec, workload, on_meta=False)
    return sum(p.numel() for p in workload.model.parameters())
