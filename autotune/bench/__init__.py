"""Benchmark tooling: tuners replayed on measured tables (``table.py``), for ``experiments/``.

It runs a :class:`~autotune.tuner.Tuner` against what a table answers, so it sits above the
tuner and the tuning loop, apart from the runners, which decide nothing.
"""
