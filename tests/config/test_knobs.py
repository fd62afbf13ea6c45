"""The knob table: its rows agree with the config schema, and the config layer stays torch-free."""

from __future__ import annotations

import subprocess
import sys
import warnings
from typing import Any

import pytest

from autotune.config import KNOBS, ConfigError, ConfigWarning, Knob, errors, load_config, set_key
from autotune.config.knobs import OFFLOAD_KEY, name_position
from autotune.tuner.naming import repeat_name


def test_importing_the_config_loads_neither_torch_nor_ray() -> None:
    code = "import autotune.config, sys; print(sorted({'torch', 'ray'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _two_values(knob: Knob) -> tuple[Any, ...]:
    if knob.default_grid:
        return knob.default_grid
    return (True, False) if knob.value_type is bool else (2, 3)


@pytest.mark.filterwarnings("ignore::autotune.config.ConfigWarning")  # round_robin_gradients
@pytest.mark.parametrize(
    "knob", [k for k in KNOBS if k.searchable], ids=[k.abbreviation for k in KNOBS if k.searchable]
)
def test_a_list_at_each_searchable_key_is_a_search_list_of_its_type(knob: Knob) -> None:
    raw: dict[str, Any] = {}
    set_key(raw, knob.key, list(_two_values(knob)))
    values = load_config(raw, world_size=2).search_space[knob.key]
    assert values == _two_values(knob)
    assert all(type(v) is knob.value_type for v in values)


def test_the_offload_choice_is_the_tuners_not_a_search_list() -> None:
    with pytest.raises(ConfigError, match=r"offload_optimizer\.device"):
        load_config({"zero_optimization": {"offload_optimizer": {"device": ["cpu", "none"]}}})
    assert load_config({"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}})
    assert name_position(OFFLOAD_KEY) == 1


def test_abbreviations_name_one_key_each_and_never_a_re_measurement() -> None:
    abbreviations = [k.abbreviation for k in KNOBS]
    assert len(set(abbreviations)) == len(abbreviations)
    for knob in KNOBS:
        assert knob.abbreviation.isalpha() and knob.abbreviation.islower()
        # "_r2" ends the folder of a re-measurement; a knob spelled "r" would take its name.
        assert f"z1_mbs4_{knob.abbreviation}2" != repeat_name("z1_mbs4", 2)


def test_a_row_cannot_tune_by_default_where_the_engine_does_not_read_it() -> None:
    with pytest.raises(ValueError, match="stages the engine ignores"):
        Knob("zero_optimization.x", "x", bool, frozenset({1}), frozenset({1, 2}), (True, False))
    with pytest.raises(ValueError, match="must be <class 'int'>"):
        Knob("zero_optimization.x", "x", int, frozenset({1}), frozenset({1}), (True, False))


def test_a_list_at_a_key_the_engine_ignores_is_warned_about_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(errors, "_warned", set())
    raw = {"zero_optimization": {"round_robin_gradients": [True, False]}}
    with pytest.warns(ConfigWarning, match=r"round_robin_gradients has no effect.*True, is used"):
        config = load_config(raw)
    assert config.search_space == {"zero_optimization.round_robin_gradients": (True, False)}
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        load_config(raw)
