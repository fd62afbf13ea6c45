"""User workloads ``package.module:function``, bad specs, and ``key=value`` arguments."""

from __future__ import annotations

import itertools
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from autotune.workloads import (
    BUILTIN_WORKLOADS,
    Workload,
    WorkloadError,
    check_workload,
    parse_workload_args,
    resolve_workload,
)

_names = itertools.count()

USER_MODULE = """
import torch
from torch import nn
import torch.nn.functional as F


class Regressor(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.lin = nn.Linear(width, 1)

    def forward(self, x, y):
        return F.mse_loss(self.lin(x).squeeze(-1), y)


def make_batch_for(width):
    def make_batch(micro_batch_size, generator):
        x = torch.randn(micro_batch_size, width, generator=generator)
        return x, x.sum(-1)
    return make_batch


class Built:
    def __init__(self, model, make_batch):
        self.model, self.make_batch = model, make_batch


def as_object(width=4):
    return Built(Regressor(width), make_batch_for(width))


def as_tuple(width=4):
    return Regressor(width), make_batch_for(width)


class Factories:
    @staticmethod
    def nested(width=4):
        return as_tuple(width)


NOT_CALLABLE = 3


def raises(width=4):
    raise RuntimeError("no GPU here\\nsecond line")


def raises_in_two_lines(width=4):  # as huggingface_hub's strict dataclasses do
    raise TypeError("Validation error for field 'width':\\n    TypeError: expected int")


def returns_int():
    return 3


def returns_triple():
    return Regressor(2), make_batch_for(2), None


def returns_non_module():
    return "model", make_batch_for(2)


def returns_non_callable_batch():
    return Regressor(2), [1, 2]


def batch_not_a_tuple():
    return Regressor(2), lambda b, g: torch.randn(b, 2)


def loss_not_scalar():
    class PerSample(Regressor):
        def forward(self, x, y):
            return (self.lin(x).squeeze(-1) - y) ** 2
    return PerSample(2), make_batch_for(2)


def needs_real_tensors():
    # .item() cannot run on meta: check_workload must fall back to the CPU.
    class DataDependent(Regressor):
        def forward(self, x, y):
            scale = float(x.abs().max().item()) or 1.0
            return F.mse_loss(self.lin(x / scale).squeeze(-1), y)
    return DataDependent(2), make_batch_for(2)
"""


@pytest.fixture
def write_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], str]:
    """Writes a module into tmp_path (on sys.path for this test) and returns its unique name."""
    monkeypatch.syspath_prepend(str(tmp_path))  # also restores sys.path afterwards

    def write(source: str) -> str:
        name = f"autotune_test_user_workload_{next(_names)}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        return name

    return write


@pytest.fixture
def user_module(write_module: Callable[[str], str]) -> str:
    return write_module(USER_MODULE)


@pytest.mark.parametrize("function", ["as_object", "as_tuple", "Factories.nested"])
def test_user_workload_trains(user_module: str, function: str) -> None:
    workload = resolve_workload(f"{user_module}:{function}", {"width": 3})
    assert isinstance(workload, Workload)
    x, y = workload.make_batch(4, torch.Generator().manual_seed(0))
    assert x.shape == (4, 3)
    workload.model(x, y).backward()
    assert workload.model.lin.weight.grad is not None  # type: ignore[union-attr]


def test_user_workload_is_seeded(user_module: str) -> None:
    a = resolve_workload(f"{user_module}:as_tuple", seed=11).model.lin.weight  # type: ignore[union-attr]
    b = resolve_workload(f"{user_module}:as_tuple", seed=11).model.lin.weight  # type: ignore[union-attr]
    assert torch.equal(a, b)


def test_check_workload_passes_good_specs(user_module: str) -> None:
    assert check_workload(f"{user_module}:as_object", {"width": 5}) == 6
    assert check_workload("mlp", {"d_in": 2, "d_hidden": 3, "n_layer": 1, "d_out": 2}) == 17


def test_check_workload_falls_back_to_cpu(user_module: str) -> None:
    assert check_workload(f"{user_module}:needs_real_tensors") == 3


def test_check_workload_builds_on_meta(user_module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    devices: list[torch.device] = []
    original = torch.nn.Linear.__init__

    def spy(self: torch.nn.Linear, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)  # type: ignore[arg-type]
        devices.append(self.weight.device)

    monkeypatch.setattr(torch.nn.Linear, "__init__", spy)
    check_workload(f"{user_module}:as_tuple")
    assert devices == [torch.device("meta")]


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("", "expected a built-in name"),
        ("gtp", r"unknown built-in workload \(did you mean 'gpt'\?\); built-ins are gpt, "),
        ("resnet", "unknown built-in workload; built-ins are gpt, hf_gpt2, mlp"),
        ("a:b:c", "malformed"),
        ("mod:", "malformed"),
        (":build", "malformed"),
        ("my-mod:build", "malformed"),
        ("mod.:build", "malformed"),
        ("autotune_no_such_module_xyz:build", "cannot import module"),
        ("autotune.workloads:no_such_function", "has no attribute 'no_such_function'"),
        ("autotune.workloads:BUILTIN_WORKLOADS", "not a function"),
    ],
)
def test_bad_spec_is_a_workload_error_naming_it(spec: str, fragment: str) -> None:
    for check in (resolve_workload, check_workload):
        with pytest.raises(WorkloadError, match=fragment) as err:
            check(spec)
        assert str(err.value).startswith(f"workload {spec!r}: ")
        assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("function", "fragment"),
    [
        ("NOT_CALLABLE", "'NOT_CALLABLE' is int, not a function"),
        ("missing", "has no attribute 'missing'"),
        ("raises", r"building it failed \(RuntimeError: no GPU here\)"),
        (
            "raises_in_two_lines",
            r"failed \(TypeError: Validation error for field 'width': TypeError: expected int\)",
        ),
        ("returns_int", "returned int; expected an object with .model"),
        ("returns_triple", "returned a tuple of 3"),
        ("returns_non_module", "its model is str, not an nn.Module"),
        ("returns_non_callable_batch", "its make_batch is list, not callable"),
    ],
)
def test_bad_user_workload_is_a_workload_error_naming_it(
    user_module: str, function: str, fragment: str
) -> None:
    spec = f"{user_module}:{function}"
    for check in (resolve_workload, check_workload):
        with pytest.raises(WorkloadError, match=fragment) as err:
            check(spec)
        assert str(err.value).startswith(f"workload {spec!r}: ")
        assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("function", "fragment"),
    [
        ("batch_not_a_tuple", "make_batch returned Tensor; expected a tuple"),
        (
            "loss_not_scalar",
            r"forward returned a torch.float32 tensor of shape \(1,\); expected a scalar",
        ),
    ],
)
def test_check_workload_rejects_what_only_a_forward_shows(
    user_module: str, function: str, fragment: str
) -> None:
    spec = f"{user_module}:{function}"
    with pytest.raises(WorkloadError, match=fragment) as err:
        check_workload(spec)
    assert str(err.value).startswith(f"workload {spec!r}: ")


def test_module_that_fails_to_import(write_module: Callable[[str], str]) -> None:
    name = write_module("import autotune_no_such_dependency_xyz\n")
    with pytest.raises(WorkloadError, match=r"cannot import module .*ModuleNotFoundError") as err:
        resolve_workload(f"{name}:build")
    assert f"'{name}:build'" in str(err.value)


def test_module_with_syntax_error(write_module: Callable[[str], str]) -> None:
    name = write_module("def build(:\n")
    with pytest.raises(WorkloadError, match=r"cannot import module .*SyntaxError"):
        resolve_workload(f"{name}:build")


def test_builtins_resolve_through_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, object]] = []

    def fake(**kwargs: object) -> Workload:
        calls.append(kwargs)
        return BUILTIN_WORKLOADS["mlp"]()

    monkeypatch.setitem(BUILTIN_WORKLOADS, "fake", fake)
    resolve_workload("fake", {"a": 1})
    assert calls == [{"a": 1}]


def test_parse_workload_args() -> None:
    parsed = parse_workload_args(
        ["n_layer=4", "dropout=0.1", "size=27m", 'name="12"', "flag=true", "dims=[1, 2]", "x=a=b"]
    )
    assert parsed == {
        "n_layer": 4,
        "dropout": 0.1,
        "size": "27m",
        "name": "12",
        "flag": True,
        "dims": [1, 2],
        "x": "a=b",
    }
    assert parse_workload_args([]) == {}
    assert parse_workload_args(["empty="]) == {"empty": ""}


@pytest.mark.parametrize(
    ("pairs", "fragment"),
    [
        (["n_layer"], "expected key=value"),
        (["=3"], "expected key=value"),
        (["a-b=1"], "expected key=value"),
        (["a=1", "a=2"], "given twice"),
    ],
)
def test_parse_workload_args_rejects(pairs: list[str], fragment: str) -> None:
    with pytest.raises(WorkloadError, match=fragment):
        parse_workload_args(pairs)


@pytest.mark.parametrize(
    ("spec", "args", "line"),
    [
        (
            "mlp",
            {"hiden": 3},
            "workload 'mlp': no argument 'hiden' (did you mean 'd_hidden'?); it takes d_in, "
            "d_hidden, n_layer, d_out",
        ),
        ("gpt", {"nlayer": 1}, "workload 'gpt': no argument 'nlayer' (did you mean 'n_layer'?)"),
    ],
)
def test_an_argument_the_workload_does_not_take_is_named_with_the_closest(
    spec: str, args: dict[str, object], line: str
) -> None:
    with pytest.raises(WorkloadError) as err:
        resolve_workload(spec, args)
    assert str(err.value).startswith(line) and "\n" not in str(err.value)
