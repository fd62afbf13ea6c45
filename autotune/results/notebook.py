"""Which results directory ``experiments/analysis.ipynb`` analyses.

A notebook's kernel runs in the notebook's own folder (``experiments/``), not where Jupyter,
``jupyter execute`` or VS Code was started, so a relative path written in the shell that
started it would be looked up in the wrong place. The shell's directory is still in the
kernel's environment (``PWD``, which a kernel inherits and nothing updates), so a relative
path is taken from there first.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from autotune.results.store import ResultsDir, ResultsDirError

RESULTS_DIR_VARIABLE = "AUTOTUNE_RESULTS_DIR"
# The run this repository holds, from the notebook's folder.
EXAMPLE_RUN = Path("..") / "results" / "example_run"


def notebook_results_dir(
    environ: Mapping[str, str] | None = None, kernel_dir: Path | None = None
) -> Path:
    """The results directory to analyse: ``$AUTOTUNE_RESULTS_DIR``, absolute or relative to
    the directory Jupyter was started in (``$PWD``), else to the notebook's folder; unset,
    the example run (``results/example_run``).

    Args:
        environ: the kernel's environment (default ``os.environ``).
        kernel_dir: the kernel's working directory, the notebook's folder (default: the
            current one, ``.``).

    Raises:
        ResultsDirError: the variable names no results directory in either place (both are
            named).

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as repo:
        ...     (Path(repo) / "runs" / "mine").mkdir(parents=True)
        ...     _ = (Path(repo) / "runs" / "mine" / "fingerprint.json").write_text("{}")
        ...     found = notebook_results_dir(
        ...         {RESULTS_DIR_VARIABLE: "runs/mine", "PWD": repo}, Path(repo) / "experiments")
        ...     found == Path(repo) / "runs" / "mine"
        True
    """
    environ = os.environ if environ is None else environ
    kernel_dir = Path() if kernel_dir is None else kernel_dir
    value = environ.get(RESULTS_DIR_VARIABLE, "").strip()
    if not value:
        return kernel_dir / EXAMPLE_RUN
    path = Path(value).expanduser()
    if path.is_absolute():
        return path
    started_in = environ.get("PWD")
    tried = [Path(started_in) / path] if started_in else []
    tried += [kernel_dir / path] if kernel_dir / path not in tried else []
    for candidate in tried:
        if ResultsDir(candidate).is_results_dir():
            return candidate
    raise ResultsDirError(
        f"{RESULTS_DIR_VARIABLE}={value} is not a results directory (no run there) in "
        + " nor in ".join(str(candidate) for candidate in tried)
        + ": give an absolute path, or one relative to where Jupyter was started"
    )
