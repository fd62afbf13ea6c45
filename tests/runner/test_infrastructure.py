"""Infrastructure failures are not verdicts: a rendezvous port taken between its choice and
rank 0's bind is run again (a bounded number of times) and never recorded as the
configuration's error. An actor lost before the experiment began: ``test_ray_pool.py``."""

from __future__ import annotations

import functools
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.experiment import ExperimentResult, ExperimentSpec, Status
from autotune.runner import LocalRunner, RankOutcome
from autotune.runner.outcome import (
    INFRASTRUCTURE_RETRIES,
    failure_outcome,
    infrastructure_failure,
    is_port_taken,
)
from autotune.runner.process import reserve_port
from autotune.runner.ray_runner import RayRunner
from tests.runner.specs import spec, taken_always, taken_once

# The failure grace the every-time test gives the ranks (seconds): never met unless waited out.
LONG_GRACE_S = 240.0


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another process listens on (every address, as a rendezvous store binds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("0.0.0.0", 0))
        listener.listen()
        yield int(listener.getsockname()[1])


def one_rank(name: str) -> ExperimentSpec:
    """:func:`spec` on one rank: rank 0 binds the rendezvous whatever the world size, and a
    retry then starts one process, not two."""
    config = {**spec(name).ds_config, "train_batch_size": 4}
    return spec(name, ds_config=config, world_size=1)


def taken_once_at(tmp_path: Path, port: int) -> functools.partial[object]:
    marker = tmp_path / "taken"
    marker.write_text(str(port))
    return functools.partial(taken_once, str(marker))


def test_a_port_collision_is_recognised_as_the_machinery_failing() -> None:
    try:
        try:
            raise OSError("EADDRINUSE: address already in use")
        except OSError as bind:
            raise RuntimeError("init_process_group failed") from bind
    except RuntimeError as exc:
        collided = failure_outcome(0, exc)
    assert is_port_taken(ValueError("Address already in use"))
    assert collided.infrastructure and not failure_outcome(0, ValueError("bad")).infrastructure
    lost_peer = RankOutcome(1, Status.error, error="RuntimeError: lost", peer_failure=True)
    assert infrastructure_failure([collided, lost_peer]) is collided
    assert infrastructure_failure([failure_outcome(0, ValueError("bad")), lost_peer]) is None


def test_a_reserved_port_is_refused_to_other_binds_but_not_to_the_rendezvous() -> None:
    import datetime

    import torch.distributed as dist

    reservation = reserve_port()
    try:
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", reservation.port))
        store = dist.TCPStore(
            "127.0.0.1", reservation.port, 1, True, timeout=datetime.timedelta(seconds=10)
        )
        store.set("key", "value")
        assert store.get("key") == b"value"
    finally:
        reservation.close()


def test_the_results_log_keeps_the_retries() -> None:
    retried = ExperimentResult("e", Status.ok, infrastructure_retries=1)
    assert ExperimentResult.from_dict(retried.to_dict()).infrastructure_retries == 1
    before = {k: v for k, v in retried.to_dict().items() if k != "infrastructure_retries"}
    assert ExperimentResult.from_dict(before).infrastructure_retries == 0


def test_local_a_port_taken_before_the_ranks_bind_it_is_run_again(
    tmp_path: Path, taken_port: int
) -> None:
    runner = LocalRunner(reserve_port=taken_once_at(tmp_path, taken_port))
    result = runner.run(one_rank("collided"))
    assert result.status is Status.ok, (result.error, result.error_detail)
    assert result.infrastructure_retries == 1
    assert result.metrics is not None and len(result.metrics.step_times_s) == 3


@pytest.mark.multirank
def test_local_a_port_taken_every_time_is_an_infrastructure_error(
    taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A grace (and a timeout) longer than all three attempts take on the most loaded machine:
    # ranks that waited it out even once would be seen, however slow the machine.
    monkeypatch.setattr("autotune.runner.local.FAILURE_GRACE_S", LONG_GRACE_S)
    runner = LocalRunner(reserve_port=functools.partial(taken_always, taken_port))
    started = time.perf_counter()
    result = runner.run(spec("always_collided", timeout_s=LONG_GRACE_S))
    assert result.status is Status.error
    assert result.error is not None and result.error.startswith("infrastructure: ")
    assert "EADDRINUSE" in result.error
    assert result.infrastructure_retries == INFRASTRUCTURE_RETRIES
    # The ranks left waiting in the failed rendezvous are stopped at once, not after a grace.
    assert time.perf_counter() - started < LONG_GRACE_S


@pytest.mark.ray
def test_ray_a_port_taken_before_the_ranks_bind_it_is_run_again(
    ray_cluster: str, tmp_path: Path, taken_port: int
) -> None:
    with RayRunner(reserve_port=taken_once_at(tmp_path, taken_port)) as runner:
        result = runner.run(one_rank("collided"))
    assert result.status is Status.ok, (result.error, result.error_detail)
    assert result.infrastructure_retries == 1
    assert result.timings.total_s > result.timings.warmup_s + result.timings.window_s
