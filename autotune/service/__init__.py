"""``autotune serve``: a tuning service a team shares, watches live and learns from.

The parts, each a module with one job:

- :mod:`~autotune.service.settings`: how the service was started (host, port, state
  directory, storage, Ray, token, allowed roots) and the refusal of an open host without a
  token.
- :mod:`~autotune.service.requests`: a job as asked over HTTP, validated (types, sizes,
  paths inside the allowed roots) before anything is written.
- :mod:`~autotune.service.queue`: the job queue, in SQLite under the state directory, so a
  ``kill -9`` loses nothing.
- :mod:`~autotune.service.knowledge`: what finished jobs taught (the answer per job key, the
  cost model's constants per hardware, the nearest answers), kept in the Optuna storage.
- :mod:`~autotune.service.worker`: one job in a process of its own: ``autotune.api.tune``.
- :mod:`~autotune.service.scheduler`: which queued job starts when, and cancelling.
- :mod:`~autotune.service.figures`: the study's figures optuna-dashboard shows.
- :mod:`~autotune.service.app`: the HTTP API, the token, the page and optuna-dashboard.
- :mod:`~autotune.service.client`: ``autotune submit``, the API from a shell.

The service tunes nothing itself: every job is ``autotune run``'s loop, through
:func:`autotune.api.tune`.
"""
