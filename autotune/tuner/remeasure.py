"""The re-measurement phase: which configurations run again, how often, and the race.

Step times vary up to ±50% run to run, so the best is declared on the median of repeats
(``<name>_r1``, ``<name>_r2``, ...): the top ``num_remeasure`` configurations and every
variant's best run again, round by round; then whatever the repeats show could still be the
best earns repeats too, and the top race on while the gap between them is wider than the
noise could explain.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping

from autotune.config import AutotuningConfig
from autotune.tuner.ledger import Ledger
from autotune.tuner.naming import repeat_name, split_repeat
from autotune.tuner.ranking import (
    Ranked,
    could_be_better,
    race_can_settle,
    relative_noise,
    score,
)
from autotune.tuner.space import Variant

# Re-measured configurations in all, as a multiple of num_remeasure (see Remeasurement.extend).
MAX_REMEASURE_FACTOR = 2
# The race among the re-measured (see Remeasurement._race): rounds beyond the fixed repeats,
# how sure a drop-out must be (one-sided z), and the gap below which configurations count as
# tied.
MAX_RACE_ROUNDS = 4
RACE_CONFIDENCE_Z = 1.64
RACE_TOLERANCE = 0.02
# A profile window shorter than this measures the machine's jitter (on 2 CPU cores, windows
# of 0.1 s varied by 36-162% run to run): such configurations are re-measured as usual but
# never raced or let in by the noise, and the summary says to lengthen the window.
MIN_WINDOW_S = 0.5


class Remeasurement:
    """The queue of re-measurements (:attr:`queue`, names in the order to run), decided from
    the results in ``ledger``.

    Args:
        ledger: what the tuner has seen.
        tuning: the ``autotuning`` section (metric, ``num_remeasure``).
        num_repeats: re-measurements of each top configuration.
    """

    def __init__(self, ledger: Ledger, tuning: AutotuningConfig, num_repeats: int) -> None:
        self._ledger = ledger
        self._tuning = tuning
        self._num_repeats = num_repeats
        self.queue: list[str] = []
        self._max_remeasured = 0  # configurations re-measured at most (see start)

    def start(self) -> None:
        """Queue the first re-measurements, round by round (every ``_r1``, then every
        ``_r2``, so slow drift hits all alike): ``num_repeats`` each for the top
        ``num_remeasure`` configurations and every variant's best, one check each for the
        suspects (:meth:`_suspects`).

        Every variant's best is measured again, interleaved with its rivals, so no stage's
        standing rests on one stretch of time: a stage whose search fell in a slow minute (a
        neighbour's job, the cluster's start-up, a GPU's clocks) is measured again beside the
        others.
        """
        limit = self._tuning.num_remeasure
        if limit == 0:
            return
        ledger = self._ledger
        # Only original measurements: replayed repeats must not change which ones are repeated.
        ranking = ledger.ranked(
            (ledger.results[n] for n in ledger.search_results()), self._tuning.metric
        )
        claims = [r.name for r in ranking[:limit]]
        best_of: dict[Variant, Ranked] = {}
        for ranked in ranking:
            best_of.setdefault(ledger.entries[ranked.name].variant, ranked)
        claims += [r.name for r in best_of.values() if r.name not in claims]
        suspects = [n for n in self._suspects(ranking, best_of) if n not in claims]
        # Those, and up to num_remeasure more that repeats show could still be the best.
        self._max_remeasured = len(claims) + len(suspects) + limit
        self.queue = [repeat_name(name, 1) for name in claims + suspects] + [
            repeat_name(name, index) for index in range(2, self._num_repeats + 1) for name in claims
        ]

    def extend(self) -> bool:
        """Queue more re-measurements once a round is done; True if any.

        Repeats pull lucky first measurements down to their median, so a configuration
        measured once can overtake them; and one measured unluckily low may trail the leader
        by less than the noise the repeats show (:func:`could_be_better`). Either earns
        repeats too, best first, up to ``num_remeasure`` more configurations, so the declared
        best is one that was repeated, no single lucky measurement stands above it unchecked
        and no single unlucky one rules a rival out. Then the race (:meth:`_race`).
        """
        limit = self._tuning.num_remeasure
        repeated = {split_repeat(n)[0] for n in self.queue}
        ranking = self._ledger.ranked(self._ledger.results.values(), self._tuning.metric)
        contenders = ranking[:limit]
        short = short_windows(self._ledger)
        measurable = [r for r in ranking if r.name not in short]
        noise = relative_noise([r for r in measurable if r.name in repeated])
        if noise is not None and measurable:
            contenders += [
                r
                for r in measurable
                if r not in contenders
                and could_be_better(
                    measurable[0],
                    r,
                    noise,
                    confidence_z=RACE_CONFIDENCE_Z,
                    tolerance=RACE_TOLERANCE,
                )
            ]
        newcomers = [r.name for r in contenders if r.name not in repeated]
        newcomers = newcomers[: max(0, self._max_remeasured - len(repeated))]
        self.queue += [
            repeat_name(name, index)
            for index in range(1, self._num_repeats + 1)
            for name in newcomers
        ]
        if newcomers or self._promote(ranking):
            return True
        return self._race([r for r in ranking if r.name in repeated])

    def _suspects(self, ranking: list[Ranked], best_of: Mapping[Variant, Ranked]) -> list[str]:
        """Configurations whose standing within their variant a slow stretch may have hidden,
        each measured once more: the variant's largest fit where a smaller size beat it (a
        larger micro-batch amortises more: the first suspect of drift no rank could see), and
        any measured only while other processes competed for the cores that could, had they
        not, be its variant's best."""
        ledger = self._ledger
        suspects = []
        for variant, best in best_of.items():
            largest = ledger.largest_fit(variant)
            if largest is not None and ledger.size_runs[variant][largest].name != best.name:
                suspects.append(ledger.size_runs[variant][largest].name)
        metric = self._tuning.metric
        suspects += [
            r.name
            for r in ranking
            if r.disturbed
            and self._quiet_bound(r.name)
            > metric.score(best_of[ledger.entries[r.name].variant].value)
        ]
        return list(dict.fromkeys(suspects))

    def _quiet_bound(self, name: str) -> float:
        """The best score ``name``'s disturbed measurements allow on a quiet machine: each
        one's score improved by how far its node was oversubscribed (a node with demand for
        1.5 times its cores runs the ranks at least 1/1.5 of their speed)."""
        bound = float("-inf")
        for result_name, result in self._ledger.results.items():
            if split_repeat(result_name)[0] != name or not result.ok or result.metrics is None:
                continue
            value = score(result.metrics, self._tuning.metric)
            factor = 1.0 + (result.metrics.oversubscription or 0.0)
            bound = max(bound, value * factor if value > 0 else value / factor)
        return bound

    def _promote(self, ranking: list[Ranked]) -> bool:
        """Give a suspect measured once again (see :meth:`_suspects`) whose check beat its
        variant's leader the repeats a variant's best gets; True if any were queued. Its
        check, not its first measurement, is the one to believe: the first is the suspect."""
        queued = Counter(split_repeat(n)[0] for n in self.queue)
        leaders: dict[Variant, Ranked] = {}
        for ranked in ranking:
            if queued[ranked.name] >= self._num_repeats:
                leaders.setdefault(self._ledger.entries[ranked.name].variant, ranked)
        metric = self._tuning.metric
        promoted = []
        for ranked in ranking:
            leader = leaders.get(self._ledger.entries[ranked.name].variant)
            if not 0 < queued[ranked.name] < self._num_repeats:
                continue
            checks = [
                score(r.metrics, metric)
                for n, r in self._ledger.results.items()
                if split_repeat(n)[0] == ranked.name
                and split_repeat(n)[1] > 0
                and r.ok
                and r.metrics is not None
                and not r.metrics.disturbed
            ]
            if checks and (leader is None or max(checks) > metric.score(leader.value)):
                promoted.append(ranked.name)
        self.queue += [
            repeat_name(name, index)
            for index in range(2, self._num_repeats + 1)
            for name in promoted
            if index > queued[name]
        ]
        return bool(promoted)

    def _race(self, contenders: list[Ranked]) -> bool:
        """One more round for the leader and every re-measured configuration that could still
        beat it by more than the noise allows (:func:`could_be_better`), and for every one
        whose repeats were disturbed (other processes competed for the cores); True if
        queued.

        Two or three repeats tell apart configurations a noise-width apart, not ones a few
        percent apart on a machine whose runs vary by 10%: those race on, up to
        :data:`MAX_RACE_ROUNDS` more measurements each, while the ones clearly behind drop out.
        A rival within :data:`RACE_TOLERANCE` of the leader that even those rounds could not
        tell from it (:func:`race_can_settle`) is a tie at this machine's noise and does not
        race: the summary says the top are within noise of each other.
        A configuration left with fewer undisturbed measurements than its repeats were meant
        to give is measured again too, up to the same bound, so that it ranks on the machine
        it will train on, not on a busy minute.
        """

        def open_rounds(ranked: list[Ranked]) -> list[tuple[str, int]]:
            """Those not yet at the bound, with the repeats each has so far."""
            counts = [
                (r.name, sum(1 for q in self.queue if split_repeat(q)[0] == r.name)) for r in ranked
            ]
            return [(n, c) for n, c in counts if c < self._num_repeats + MAX_RACE_ROUNDS]

        racing: list[tuple[str, int]] = []
        # The race is for the top: the best few of the re-measured (every variant's best is
        # re-measured for its own standing, not to race).
        short = short_windows(self._ledger)
        top = [r for r in contenders if r.name not in short]
        top = top[: MAX_REMEASURE_FACTOR * self._tuning.num_remeasure]
        noise = relative_noise(top)
        if noise is not None and len(top) >= 2:
            leader, *others = top
            # A rival races while it may still beat the leader and the rounds left could
            # tell: on a noisy machine, ones within the tolerance stay tied however long.
            most = 1 + self._num_repeats + MAX_RACE_ROUNDS
            rivals = [
                r
                for r in others
                if could_be_better(
                    leader, r, noise, confidence_z=RACE_CONFIDENCE_Z, tolerance=RACE_TOLERANCE
                )
                and race_can_settle(
                    leader, r, noise, tolerance=RACE_TOLERANCE, max_measurements=most
                )
            ]
            racing = open_rounds([leader, *rivals])
            if not racing or racing[0][0] != leader.name or len(racing) < 2:
                racing = []  # the leader is done racing, or nothing races it
        # Measured again for a reason the disturbance spoiled: once more, up to the bound.
        queued = Counter(split_repeat(n)[0] for n in self.queue)
        disturbed = [
            r for r in contenders if r.num_disturbed and r.num_undisturbed < queued[r.name]
        ]
        racing += [(n, c) for n, c in open_rounds(disturbed) if n not in dict(racing)]
        self.queue += [repeat_name(n, count + 1) for n, count in racing]
        return bool(racing)


def short_windows(ledger: Ledger) -> dict[str, float]:
    """Configurations whose profile window lasted under :data:`MIN_WINDOW_S` (median over
    their ok runs), with that median."""
    windows: dict[str, list[float]] = {}
    for name, result in ledger.results.items():
        if result.ok and result.timings.window_s > 0:
            windows.setdefault(split_repeat(name)[0], []).append(result.timings.window_s)
    medians = {name: statistics.median(seconds) for name, seconds in windows.items()}
    return {name: s for name, s in medians.items() if s < MIN_WINDOW_S}
