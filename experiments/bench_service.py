"""What the service's learning saves: a second model tuned after a first on the same hardware,
with and without what the service learned from the first.

Each round starts two fresh services (``autotune serve``, each its own state directory):

- **learned**: the first model is tuned, then the second; the second starts from what the
  first taught (the constants fitted on this hardware, the first's answer tried first);
- **cold**: the second model alone, as a service that has seen nothing tunes it.

For the second model's job in each it reports: the experiments the job ran, the experiments
and wall time until its answer was first measured ("to the answer"), the job's wall time
(submission to its end), and the answer with its value. Wall times are the job's own (the
service's start is not in them).

    python experiments/bench_service.py [--rounds 2] [--runner local|ray]

Prints a table and writes every figure to ``results/bench_service.json``. The ranks use every
core: run it on a quiet machine, and say where it was not.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotune.runner import free_port  # noqa: E402
from autotune.service.client import Client  # noqa: E402

RESULTS = ROOT / "results" / "bench_service.json"
# Two different models: the built-in GPT, then one twice as deep and wider (the nearest
# earlier answer is the first's; the constants are the hardware's, not the model's).
FIRST = {"workload": "gpt"}
SECOND = {"workload": "gpt", "workload_args": {"n_layer": 4, "d_model": 192, "n_head": 6}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--runner", choices=("local", "ray"), default="ray")
    args = parser.parse_args()
    rounds = []
    for number in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="bench_service_") as folder:
            learned = with_service(Path(folder) / "learned", args.runner, [FIRST, SECOND])
            cold = with_service(Path(folder) / "cold", args.runner, [SECOND])
        rounds.append(
            {"round": number, "learned": learned[-1], "first": learned[0], "cold": cold[0]}
        )
        print_round(rounds[-1])
    summary = {
        kind: {
            field: statistics.median(r[kind][field] for r in rounds)
            for field in ("experiments", "experiments_to_answer", "wall_to_answer_s", "wall_s")
        }
        for kind in ("learned", "cold")
    }
    print("\nmedian over rounds (the second model):")
    for kind, figures in summary.items():
        print(f"  {kind:8s} " + ", ".join(f"{k} {v:.3g}" for k, v in figures.items()))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "machine": {
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "load_average_at_end": os.getloadavg(),
                },
                "runner": args.runner,
                "first": FIRST,
                "second": SECOND,
                "rounds": rounds,
                "median": summary,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"written: {RESULTS.relative_to(ROOT)}")


def with_service(state_dir: Path, runner: str, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Start a fresh service, tune ``jobs`` one after another on it, stop it; each job's
    figures."""
    port = free_port()
    log = (state_dir.parent / f"{state_dir.name}.log").open("w")
    service = subprocess.Popen(
        [
            *(sys.executable, "-m", "autotune", "serve", "--port", str(port)),
            *("--state-dir", str(state_dir), "--runner", runner),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    client = Client(f"http://127.0.0.1:{port}")
    try:
        _wait_until_up(client, service)
        return [tuned(client, state_dir, job) for job in jobs]
    finally:
        service.terminate()
        service.wait(timeout=120)
        log.close()


def tuned(client: Client, state_dir: Path, job: dict[str, Any]) -> dict[str, Any]:
    submitted = time.time()
    answer = client.submit(job)
    view = client.wait(answer["id"])
    wall_s = time.time() - submitted
    if view["status"] != "succeeded":
        raise SystemExit(f"job {job} {view['status']}: {view['error']}")
    to_answer, at_s = _to_the_answer(state_dir, answer["id"], view["best"]["name"], submitted)
    return {
        "job": job,
        "experiments": view["experiments"],
        "experiments_to_answer": to_answer,
        "wall_to_answer_s": at_s,
        "wall_s": wall_s,
        "answer": view["best"]["name"],
        "value": view["best"]["value"],
        "warm_start": view["warm_start"],
    }


def _to_the_answer(state_dir: Path, job_id: str, best: str, submitted: float) -> tuple[int, float]:
    """How many experiments had finished when the answer was first measured, and when."""
    from autotune.results import ResultsDir
    from autotune.service.queue import JobQueue

    stored = JobQueue(state_dir / "jobs.db").get(job_id)
    assert stored is not None and stored.results_dir is not None
    study = ResultsDir(stored.results_dir).run_study.load()
    assert study is not None
    finished = sorted(
        (t for t in study.get_trials(deepcopy=False) if t.datetime_complete is not None),
        key=lambda t: t.datetime_complete,  # type: ignore[arg-type,return-value]
    )
    for count, trial in enumerate(finished, start=1):
        if trial.user_attrs.get("name") == best:
            assert trial.datetime_complete is not None
            return count, trial.datetime_complete.timestamp() - submitted
    raise AssertionError(f"{best} is not among the job's trials")


def _wait_until_up(client: Client, service: subprocess.Popen[Any]) -> None:
    deadline = time.monotonic() + 180
    while True:
        try:
            client._call("GET", "/api/health")
            return
        except Exception:
            if service.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("autotune serve did not start") from None
            time.sleep(0.5)


def print_round(entry: dict[str, Any]) -> None:
    print(
        f"round {entry['round']}: the first model took {entry['first']['experiments']} experiments"
    )
    print(
        f"  {'second model':14s} {'experiments':>11s} {'to answer':>9s} {'s to answer':>11s} "
        f"{'wall s':>7s}  answer"
    )
    for kind in ("learned", "cold"):
        r = entry[kind]
        print(
            f"  {kind:14s} {r['experiments']:11d} {r['experiments_to_answer']:9d} "
            f"{r['wall_to_answer_s']:11.1f} {r['wall_s']:7.1f}  {r['answer']} ({r['value']:.4g})"
        )


if __name__ == "__main__":
    main()
