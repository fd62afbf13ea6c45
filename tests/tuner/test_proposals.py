"""Seeded replays propose exactly the experiments they proposed when ``proposals.json`` was
recorded: every tuner type on every committed landscape and on a GPU-shaped one, two seeds.

A refactor of the tuner must leave this file's expectations unchanged. A change meant to alter
what the tuner proposes re-records them, and its commit says why the sequences moved:

    python -m tests.tuner.test_proposals --update
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from autotune.bench.table import replay

ROOT = Path(__file__).resolve().parents[2]
RECORDED = Path(__file__).with_name("proposals.json")
TUNER_TYPES = ("gridsearch", "random", "model_based")
SEEDS = (0, 1)


MEASURED = sorted((ROOT / "results" / "landscapes").glob("*.json"))
SIMULATED = "simulated_gpt-1.3b_a100-80gb"


def _landscapes() -> dict[str, dict[str, Any]]:
    from autotune.bench.simulated import MODELS, simulated_landscape

    tables = {path.stem: json.loads(path.read_text()) for path in MEASURED}
    tables[SIMULATED] = simulated_landscape(MODELS["gpt-1.3b"], "a100-80gb", seed=0)
    return tables


def _proposals(table: dict[str, Any], tuner_type: str, seed: int) -> list[str]:
    return list(replay(table, tuner_type, seed).names)


def _cases() -> list[tuple[str, str, int]]:
    names = [path.stem for path in MEASURED] + [SIMULATED]
    return [(name, tuner, seed) for name in names for tuner in TUNER_TYPES for seed in SEEDS]


def _key(landscape: str, tuner_type: str, seed: int) -> str:
    return f"{landscape}/{tuner_type}/{seed}"


@pytest.fixture(scope="module")
def tables() -> dict[str, dict[str, Any]]:
    return _landscapes()


@pytest.fixture(scope="module")
def recorded() -> dict[str, list[str]]:
    return json.loads(RECORDED.read_text())


def test_every_case_is_recorded(recorded: dict[str, list[str]]) -> None:
    assert sorted(recorded) == sorted(_key(*case) for case in _cases())


@pytest.mark.parametrize(("landscape", "tuner_type", "seed"), _cases())
def test_the_seeded_replay_proposes_what_it_recorded(
    tables: dict[str, dict[str, Any]],
    recorded: dict[str, list[str]],
    landscape: str,
    tuner_type: str,
    seed: int,
) -> None:
    proposed = _proposals(tables[landscape], tuner_type, seed)
    assert proposed == recorded[_key(landscape, tuner_type, seed)], (
        "the tuner proposes other experiments than recorded; if that is meant, re-record with "
        "`python -m tests.tuner.test_proposals --update` and say why in the commit"
    )


def _update() -> None:
    tables = _landscapes()
    recorded = {_key(*case): _proposals(tables[case[0]], *case[1:]) for case in _cases()}
    RECORDED.write_text(json.dumps(recorded, indent=1) + "\n")
    print(f"recorded {len(recorded)} replays in {RECORDED}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python -m tests.tuner.test_proposals --update")
    _update()
