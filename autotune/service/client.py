"""``autotune submit``: the service's API from a shell (the standard library's HTTP client,
so that a submitting machine needs nothing but autotune)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from autotune.service.queue import FINISHED

POLL_S = 2.0


class ClientError(RuntimeError):
    """The service refused the request or could not be reached (one line)."""


class Client:
    """The API of the service at ``server`` (``http://host:port``), with ``token`` if given."""

    def __init__(self, server: str, token: str | None = None, timeout_s: float = 60.0) -> None:
        self.server = server.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def submit(self, job: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /api/jobs``: ``{id, status, cached}``."""
        return self._call("POST", "/api/jobs", job)

    def job(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/api/jobs/{job_id}")

    def wait(self, job_id: str, on_change: Any = None) -> dict[str, Any]:
        """Poll the job until it ends; its last view. ``on_change(view)`` is called when its
        status or experiment count changes."""
        seen = None
        while True:
            view = self.job(job_id)
            now = (view["status"], view["experiments"])
            if now != seen and on_change is not None:
                on_change(view)
            seen = now
            if view["status"] in FINISHED:
                return view
            time.sleep(POLL_S)

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(dict(body)).encode()
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(
            self.server + path, data=data, method=method, headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as err:
            raise ClientError(f"{self.server}: {err.code}: {_detail(err)}") from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise ClientError(f"cannot reach {self.server}: {reason}") from None


def progress_line(view: Mapping[str, Any]) -> str:
    """How a followed job stands, in words: its status and experiments, or, for a job the
    service answered with an earlier job's answer, which job that was.

    Example:
        >>> progress_line({"status": "running", "experiments": 3, "cached": False})
        'running: 3 experiment(s)'
        >>> progress_line({"status": "succeeded", "experiments": 0, "cached": True,
        ...                "cached_from": "a1b2"})
        "succeeded: answered with job a1b2's answer, no experiment run"
    """
    if view.get("cached"):
        source = f"job {view['cached_from']}" if view.get("cached_from") else "an earlier job"
        return f"{view['status']}: answered with {source}'s answer, no experiment run"
    return f"{view['status']}: {view['experiments']} experiment(s)"


def _detail(err: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(err.read())["detail"])
    except (ValueError, KeyError, TypeError, OSError):
        return str(err.reason)
