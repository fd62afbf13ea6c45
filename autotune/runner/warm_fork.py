"""Imported by the local runner's forkserver as it starts, the one code multiprocessing runs
there: it imports what each rank forked from the server would otherwise import in its first
experiment (:func:`autotune.runner.rank.preload_rank_modules`)."""

from autotune.runner.rank import preload_rank_modules

preload_rank_modules()
