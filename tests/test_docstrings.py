"""Every ``>>>`` example in autotune's docstrings runs and shows what it says, so the examples
cannot drift from the code. Importing every module also proves each imports cleanly without a
process group or a Ray cluster."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from pathlib import Path

import pytest

import autotune

# ``python -m autotune`` runs the command line when imported: no docstrings to run there.
MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(autotune.__path__, prefix="autotune.")
    if info.name != "autotune.__main__"
)
REPOSITORY = Path(__file__).resolve().parents[1]
# Output such as log timestamps and addresses is elided with "..."; line breaks are layout.
OPTIONS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def examples_of(module_name: str) -> list[doctest.DocTest]:
    module = importlib.import_module(module_name)
    tests = doctest.DocTestFinder().find(module, module_name)
    return [test for test in tests if test.examples]


# The RayRunner's example runs experiments on Ray (its own cluster, or the session's).
RAY_MODULES = {"autotune.runner.ray_runner"}


@pytest.mark.parametrize(
    "module_name",
    [pytest.param(n, marks=pytest.mark.ray) if n in RAY_MODULES else n for n in MODULES],
)
def test_docstring_examples_run(module_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Paths in the examples (``results/example_run``) are the repository's, as a reader
    # running them from a checkout would see them.
    monkeypatch.chdir(REPOSITORY)
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=OPTIONS)
    for test in examples_of(module_name):
        runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)


def test_the_examples_are_found() -> None:
    # A finder that found nothing would pass every module above.
    found = {name: examples_of(name) for name in MODULES}
    with_examples = [name for name, tests in found.items() if tests]
    assert len(with_examples) >= 20, with_examples
    assert sum(len(t.examples) for tests in found.values() for t in tests) >= 100
