"""Every way a request names code runs only code inside an allowed root, judged by where the
import or the file really resolves: the bypasses a name-only check let through (``-m`` of an
installed module, a root's ``os/`` or ``torch/`` folder standing in for the installed one, a
link out of the root, a root module re-exporting an installed function), each refused."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("optuna_dashboard")

from fastapi.testclient import TestClient

from autotune.service.imports import import_problem, module_files
from autotune.service.queue import JobQueue
from autotune.service.worker import JobRun
from autotune.workloads import WorkloadError
from tests.service.test_api import service


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A shared root with what a team keeps there: a project, a model module, a package,
    and checkouts named as installed packages are."""
    shared = tmp_path / "shared"
    project = shared / "project"
    project.mkdir(parents=True)
    (project / "train.py").write_text("print('training')\n")
    (project / "trainer.py").write_text("print('training')\n")
    (shared / "models.py").write_text("def build():\n    ...\n")
    (shared / "teampkg" / "nets").mkdir(parents=True)
    (shared / "teampkg" / "__init__.py").write_text("")
    (shared / "teampkg" / "nets" / "__init__.py").write_text("")
    (shared / "teampkg" / "nets" / "wide.py").write_text("def build():\n    ...\n")
    (shared / "os").mkdir()  # a folder that merely shares the standard library's name
    (shared / "os" / "__init__.py").write_text("def system(command):\n    ...\n")
    (shared / "torch").mkdir()  # a checkout of torch, as a shared root may well hold
    (shared / "torch" / "__init__.py").write_text("")
    (shared / "torch" / "hub.py").write_text("def load(**kwargs):\n    ...\n")
    (project / "pip").mkdir()  # shadows the installed pip in the script's own folder
    (project / "pip" / "__init__.py").write_text("")
    (project / "pip" / "__main__.py").write_text("print('not pip')\n")
    (shared / "linked.py").symlink_to(Path(__file__).resolve())  # a link out of the root
    return shared.resolve()


def refused(http: TestClient, queue: JobQueue, body: dict[str, Any], status: int = 403) -> str:
    answer = http.post("/api/jobs", json=body)
    assert answer.status_code == status, answer.text
    detail = answer.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail
    assert queue.latest() == []  # nothing queued
    return str(detail)


def test_m_of_an_installed_or_standard_module_is_refused(tmp_path: Path, root: Path) -> None:
    http, queue = service(tmp_path, allowed_roots=(root,))
    cwd = str(root / "project")
    said = refused(http, queue, {"script": ["-m", "optuna", "--version"], "cwd": cwd})
    assert "installed" in said and "--allow-installed-modules" in said
    said = refused(http, queue, {"script": ["-m", "http.server", "--directory", "/"], "cwd": cwd})
    assert "standard library" in said
    # The script's own folder comes first for -m, but the ranks have the installed pip.
    said = refused(http, queue, {"script": ["-m", "pip", "install", "x"], "cwd": cwd})
    assert "'pip' is also installed" in said
    refused(http, queue, {"script": ["-m", "no_such_module"], "cwd": cwd})
    refused(http, queue, {"script": ["-m", "../train"], "cwd": cwd}, 400)
    ok = http.post("/api/jobs", json={"script": ["-m", "trainer"], "cwd": cwd})
    assert ok.status_code == 201, ok.text


def test_a_service_started_to_allow_it_runs_installed_modules(tmp_path: Path, root: Path) -> None:
    http, _ = service(tmp_path, allowed_roots=(root,), allow_installed_modules=True)
    body = {"script": ["-m", "optuna", "--version"], "cwd": str(root / "project")}
    answer = http.post("/api/jobs", json=body)
    assert answer.status_code == 201, answer.text


@pytest.mark.parametrize(
    ("workload", "says"),
    [
        ("os:system", "standard library"),  # the root's os/ is not what `import os` loads
        ("torch.hub:load", "'torch' is also installed"),  # nor its torch/ what ranks load
        ("subprocess:run", "in none of the allowed roots"),
        ("linked:build", "outside the allowed roots"),  # a link resolves out of the root
        ("teampkg.nets.missing:build", "not found"),
    ],
)
def test_a_workload_module_is_judged_by_where_it_resolves(
    tmp_path: Path, root: Path, workload: str, says: str
) -> None:
    http, queue = service(tmp_path, allowed_roots=(root,))
    said = refused(http, queue, {"workload": workload, "workload_args": {"command": "id"}})
    assert says in said


def test_workloads_in_a_root_are_accepted(tmp_path: Path, root: Path) -> None:
    http, _ = service(tmp_path, allowed_roots=(root,))
    for workload in ("models:build", "teampkg.nets.wide:build"):
        answer = http.post("/api/jobs", json={"workload": workload})
        assert answer.status_code == 201, answer.text


def test_module_files_are_the_files_the_import_runs(root: Path) -> None:
    files = module_files("teampkg.nets.wide", [str(root)])
    assert files == [
        str(root / "teampkg" / "__init__.py"),
        str(root / "teampkg" / "nets" / "__init__.py"),
        str(root / "teampkg" / "nets" / "wide.py"),
    ]
    # Already imported here: the loaded module is what an import gives, whatever the path.
    assert module_files("json", [str(root)])[0] == sys.modules["json"].__file__
    assert import_problem("teampkg.nets.wide", [*sys.path, str(root)], [root]) is None
    assert "installed" in str(import_problem("torch.hub", [*sys.path, str(root)], [root]))


def test_the_job_checks_again_where_its_workload_function_is_defined(
    tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A root module is allowed, but the function it names is the installed subprocess.run.
    (root / "reexport.py").write_text("from subprocess import run as build\n")
    (root / "honest.py").write_text("def build():\n    ...\n")
    monkeypatch.setenv("AUTOTUNE_SERVICE_ROOTS", str(root))
    monkeypatch.chdir(tmp_path)
    queue = JobQueue(tmp_path / "jobs.db")
    for module in ("reexport", "honest"):
        monkeypatch.delitem(sys.modules, module, raising=False)
        job = queue.add({"workload": f"{module}:build"})
        run = JobRun(queue, job, "sqlite:///unused.db")
        run._enter_cwd()
        if module == "reexport":
            with pytest.raises(WorkloadError, match=r"defined in .*subprocess\.py, outside"):
                run._check_code()
        else:
            run._check_code()
        sys.modules.pop(module, None)
    # A -m script's module too: the project's pip/ folder is not what an import loads here.
    job = queue.add({"script": ["-m", "pip", "install", "x"], "cwd": str(root / "project")})
    run = JobRun(queue, job, "sqlite:///unused.db")
    run._enter_cwd()
    with pytest.raises(WorkloadError, match="'pip' is also installed"):
        run._check_code()
