"""The service measured: what its learning saves (``--case learned``), and how it holds under
load (``--case load``).

**learned**: a second model tuned after a first on the same hardware, with and without what
the service learned from the first. Each round starts two fresh services (``autotune serve``,
each its own state directory):

- **learned**: the first model is tuned, then the second; the second starts from what the
  first taught (the constants fitted on this hardware, the first's answer tried first);
- **cold**: the second model alone, as a service that has seen nothing tunes it.

For the second model's job in each it reports: the experiments the job ran, the experiments
and wall time until its answer was first measured ("to the answer"), the job's wall time
(submission to its end), and the answer with its value. Wall times are the job's own (the
service's start is not in them).

**load**: ``--jobs`` (12) different small jobs submitted at once (each from its own thread)
while ``--pollers`` (4) threads poll the job list and a job's view, as open pages and
``autotune submit --wait`` do, until every job has ended. It reports how the jobs ended and in
what order they started, the GETs served (per second, p50/p99 latency, errors), and the
service's own CPU while it served them (its process only: the jobs' processes are not in it),
and the jobs' wall time against the sum of their own.

    python experiments/bench_service.py [--case learned|load] [--rounds 2] [--runner local|ray]

Prints a table and writes every figure to ``results/bench_service.json`` (``learned``) or
``results/bench_service_load.json`` (``load``). The ranks use every core: run it on a quiet
machine, and say where it was not.
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
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotune.runner import free_port  # noqa: E402
from autotune.service.client import Client  # noqa: E402
from autotune.service.queue import FINISHED  # noqa: E402

RESULTS = ROOT / "results" / "bench_service.json"
LOAD_RESULTS = ROOT / "results" / "bench_service_load.json"
# Two different models: the built-in GPT, then one twice as deep and wider (the nearest
# earlier answer is the first's; the constants are the hardware's, not the model's).
FIRST = {"workload": "gpt"}
SECOND = {"workload": "gpt", "workload_args": {"n_layer": 4, "d_model": 192, "n_head": 6}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=("learned", "load"), default="learned")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--runner", choices=("local", "ray"), default="ray")
    parser.add_argument("--jobs", type=int, default=12)
    parser.add_argument("--pollers", type=int, default=4)
    args = parser.parse_args()
    if args.case == "load":
        load_case(args.runner, args.jobs, args.pollers)
        return
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
    service, client = _start_service(state_dir, runner)
    try:
        return [tuned(client, state_dir, job) for job in jobs]
    finally:
        _stop_service(service)


def _start_service(state_dir: Path, runner: str) -> tuple[subprocess.Popen[Any], Client]:
    """A fresh ``autotune serve`` on a free port, up; its output in ``<state_dir>.log``."""
    port = free_port()
    state_dir.parent.mkdir(parents=True, exist_ok=True)
    log = (state_dir.parent / f"{state_dir.name}.log").open("w")
    service = subprocess.Popen(
        [
            *(sys.executable, "-m", "autotune", "serve", "--port", str(port)),
            *("--state-dir", str(state_dir), "--runner", runner),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )
    log.close()
    client = Client(f"http://127.0.0.1:{port}")
    _wait_until_up(client, service)
    return service, client


def _stop_service(service: subprocess.Popen[Any]) -> None:
    service.terminate()
    service.wait(timeout=120)


# --- the load case --------------------------------------------------------------------------------


def load_case(runner: str, num_jobs: int, num_pollers: int) -> None:
    """``num_jobs`` jobs submitted at once, ``num_pollers`` threads polling until all ended."""
    # Different models (so that none is answered from another), each two experiments on one
    # rank: the service is what is measured, and the jobs share the machine with it.
    jobs = [
        {
            "workload": "mlp",
            "world_size": 1,
            "num_trials": 2,
            "workload_args": {"d_hidden": 64 + 8 * n},
        }
        for n in range(num_jobs)
    ]
    with tempfile.TemporaryDirectory(prefix="bench_service_load_") as folder:
        state_dir = Path(folder) / "state"
        service, client = _start_service(state_dir, runner)
        try:
            started = time.time()
            ids = _submit_at_once(client, jobs)
            cpu_before, polled_from = _cpu_s(service.pid), time.monotonic()
            latencies = _poll_until_ended(client, ids, num_pollers)
            polled_s = time.monotonic() - polled_from
            service_cpu_s = _cpu_s(service.pid) - cpu_before
            wall_s = time.time() - started
            views = [client.job(job_id) for job_id in ids]
        finally:
            _stop_service(service)
    figures = _load_figures(views, latencies, polled_s, service_cpu_s, wall_s)
    print_load(figures, num_jobs, num_pollers, runner)
    LOAD_RESULTS.parent.mkdir(exist_ok=True)
    LOAD_RESULTS.write_text(
        json.dumps(
            {
                "machine": {
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "load_average_at_end": os.getloadavg(),
                },
                "runner": runner,
                "jobs": jobs,
                "pollers": num_pollers,
                **figures,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"written: {LOAD_RESULTS.relative_to(ROOT)}")


def _submit_at_once(client: Client, jobs: list[dict[str, Any]]) -> list[str]:
    """Each job POSTed from its own thread, all released together; the ids in the order the
    service numbered them (its submission order)."""
    answers: list[dict[str, Any] | None] = [None] * len(jobs)
    go = threading.Barrier(len(jobs))

    def submit(index: int) -> None:
        go.wait()
        answers[index] = client.submit(jobs[index])

    threads = [threading.Thread(target=submit, args=(n,)) for n in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    listed = client._call("GET", f"/api/jobs?limit={len(jobs)}")
    return [job["id"] for job in reversed(listed)]


def _poll_until_ended(client: Client, ids: list[str], num_pollers: int) -> dict[str, list[float]]:
    """Poll the list and the jobs' views from ``num_pollers`` threads until every job ended;
    each request's latency (s) by kind, and the failed requests under ``errors``."""
    latencies: dict[str, list[float]] = {"list": [], "job": [], "errors": []}
    done = threading.Event()
    lock = threading.Lock()

    def poll(offset: int) -> None:
        count = offset
        while not done.is_set():
            count += 1
            path = "/api/jobs" if count % 2 else f"/api/jobs/{ids[count % len(ids)]}"
            kind = "list" if count % 2 else "job"
            began = time.perf_counter()
            try:
                client._call("GET", path)
            except Exception:
                with lock:
                    latencies["errors"].append(time.perf_counter() - began)
                continue
            with lock:
                latencies[kind].append(time.perf_counter() - began)

    threads = [threading.Thread(target=poll, args=(n,)) for n in range(num_pollers)]
    for thread in threads:
        thread.start()
    try:
        while not all(client.job(job_id)["status"] in FINISHED for job_id in ids):
            time.sleep(2.0)
    finally:
        done.set()
        for thread in threads:
            thread.join()
    return latencies


def _cpu_s(pid: int) -> float:
    """The CPU time (user + system) process ``pid`` itself has used, not its children's."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _load_figures(
    views: list[dict[str, Any]],
    latencies: dict[str, list[float]],
    polled_s: float,
    service_cpu_s: float,
    wall_s: float,
) -> dict[str, Any]:
    def quantiles(values: list[float]) -> dict[str, float]:
        if len(values) < 2:
            return {"p50_ms": float("nan"), "p99_ms": float("nan")}
        cuts = statistics.quantiles(values, n=100)
        return {"p50_ms": 1000 * cuts[49], "p99_ms": 1000 * cuts[98]}

    def at(text: str) -> float:
        return datetime.fromisoformat(text).timestamp()

    started = sorted(views, key=lambda view: at(view["started_at"]) if view["started_at"] else 0)
    jobs_s = sum(
        at(view["finished_at"]) - at(view["started_at"])
        for view in views
        if view["started_at"] and view["finished_at"]
    )
    gets = len(latencies["list"]) + len(latencies["job"])
    return {
        "statuses": [view["status"] for view in views],
        "errors_of_jobs": [view["error"] for view in views if view["error"]],
        "started_in_submission_order": [v["id"] for v in started] == [v["id"] for v in views],
        "experiments": [view["experiments"] for view in views],
        "gets": gets,
        "gets_per_s": gets / polled_s,
        "get_errors": len(latencies["errors"]),
        "list": quantiles(latencies["list"]),
        "job": quantiles(latencies["job"]),
        "polled_s": polled_s,
        "service_cpu_s": service_cpu_s,
        "service_cpu_share_of_a_core": service_cpu_s / polled_s,
        "wall_s": wall_s,
        "sum_of_jobs_s": jobs_s,
    }


def print_load(figures: dict[str, Any], num_jobs: int, num_pollers: int, runner: str) -> None:
    ended = {s: figures["statuses"].count(s) for s in sorted(set(figures["statuses"]))}
    print(f"{num_jobs} jobs submitted at once, {num_pollers} threads polling ({runner} runner)")
    print(
        f"  ended:            {ended}; started in submission order: "
        f"{figures['started_in_submission_order']}"
    )
    print(
        f"  GETs served:      {figures['gets']} in {figures['polled_s']:.0f} s "
        f"({figures['gets_per_s']:.0f}/s), {figures['get_errors']} failed"
    )
    for kind, name in (("list", "GET /api/jobs"), ("job", "GET /api/jobs/{id}")):
        print(
            f"  {name:19s} p50 {figures[kind]['p50_ms']:.1f} ms, p99 "
            f"{figures[kind]['p99_ms']:.1f} ms"
        )
    print(
        f"  service's own CPU {figures['service_cpu_s']:.1f} s "
        f"({100 * figures['service_cpu_share_of_a_core']:.0f}% of a core while polled)"
    )
    print(f"  wall {figures['wall_s']:.0f} s for {figures['sum_of_jobs_s']:.0f} s of jobs")


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
