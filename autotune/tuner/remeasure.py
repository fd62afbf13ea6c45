"""Re-measurement: only what could still change the answer.

One measurement of a configuration varies run to run (the machine's noise: a few percent on
a quiet machine, more on a shared one). Once the search ends, the best is declared on the
evidence the run has, and an experiment is spent on a configuration only where another
measurement could move the answer by more than :data:`~autotune.tuner.ranking.TOLERANCE`:

1. The leader, measured once, is measured again while it is in doubt: while its nearest
   rival could beat it as in (2), or its lead is larger than the noise could explain
   (:data:`SURPRISE_Z`: more likely a faulty measurement than a real lead). On a quiet
   machine (3% run to run) a leader of single measurements is never in doubt for its own
   sake: the expected loss of declaring it is under the line even against a tie.
2. A rival that could still be better than the leader by more than the tolerance, by more
   than :data:`MAX_EXPECTED_LOSS` in expectation (the relative gap between their medians,
   with the noise a median of that many measurements carries), earns a measurement, of
   itself or of the leader (whichever has fewer). Rivals within noise that more measurements
   could not tell apart cost nothing: the expected loss of declaring either is below the line
   once each has two measurements, and the summary says the top are within noise of each
   other (ties go to the lower peak memory, then the name).
3. A configuration measured only while other processes competed for the ranks' cores
   (``disturbed``: its value is too low) is measured once more, if it could be its variant's
   best or a rival on a quiet machine: a busy minute must not decide a stage's standing. A
   machine busy throughout (:meth:`Remeasurement.busy`: most measurements disturbed, the last
   few too) is not measured again for it: another measurement would meet the same busy
   machine. Before the answer is declared on the evidence there is, the run waits a while
   for the machine to quiet down (:meth:`Remeasurement.waits_for_quiet`; the driver watches
   the node's CPUs, see :func:`~autotune.profiling.interference.wait_for_quiet`): a
   neighbour that leaves in that time does not decide the ranking.
4. The control, the first configuration the search measured, is measured again every
   :data:`CONTROL_EVERY` search experiments and at the end: where the machine changed under
   the run unseen (a GPU's clocks, a slow start-up), it measures slower than its fastest by
   more than the noise, and what was measured between its neighbouring measurements is
   treated as in (3), measured until three measurements make its median the quiet
   machine's.

The noise is pooled from every configuration measured more than once, shrunk towards a prior
guess (:func:`~autotune.tuner.cost_model.measurement_noise`; with no repeats at all it is
that guess, and the summary says so). At most ``num_remeasure`` configurations are
re-measured for (2), each at most :data:`MAX_MEASUREMENTS` times.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter

from autotune.config import AutotuningConfig
from autotune.tuner.busy import busy
from autotune.tuner.cost_model import measurement_noise
from autotune.tuner.history import History
from autotune.tuner.noise import MIN_WINDOW_S, expected_loss, is_quiet, short_windows
from autotune.tuner.ranking import Ranked, score

# A rival is worth another measurement while the expected share by which it beats the leader
# beyond the tolerance is at least this; the leader measured once is measured again while its
# nearest rival's is. At the prior noise (3% run to run) a tie of single measurements comes to
# 0.88%: on a quiet machine a leader is not confirmed for its own sake.
MAX_EXPECTED_LOSS = 0.01
# A leader ahead of its nearest rival by more than this many standard deviations of their
# difference is measured again however little the noise model says it could move: a lead that
# far out is more likely a faulty measurement than a real one (a timer's, or a first run's).
SURPRISE_Z = 3.0
# Measurements of one configuration at most, its first included.
MAX_MEASUREMENTS = 4

# The control measured slower than its fastest by more than this many standard deviations of
# a difference says the machine changed under the run, unseen.
DRIFT_Z = 3.0
MAX_DRIFT_NOISE = 0.06
# The control is measured again after this many search experiments, and at the end if this
# many ran since (a shorter run's first and last measurements are seconds apart).
CONTROL_EVERY = 8
CONTROL_AT_END = 4


class Remeasurement:
    """Decides the next re-measurement from the results in ``history`` (see the module
    docstring); deterministic, so a resumed run decides alike.

    Args:
        history: what the tuner has seen.
        tuning: the ``autotuning`` section (metric, ``num_remeasure``).

    The control's timeline is the order experiments were proposed (``history.proposed``), the
    same however many ran at once.
    """

    def __init__(
        self, history: History, tuning: AutotuningConfig, quiet_at: int | None = None
    ) -> None:
        self._history = history
        self._tuning = tuning
        # How many results were in when the node was last seen quiet between experiments
        # (the driver watched it): the machine is not busy until a later measurement says so.
        self._quiet_at = quiet_at

    def noise(self) -> float:
        """The relative noise of one measurement, from the repeats so far (the control's
        too, unless it saw the machine slow down: that spread is drift, not noise), and at
        least what the windows' own steps vary by (the median window's standard error)."""
        return max(self._noise(with_control=not self.slowdowns()), self._window_noise())

    def noise_measured(self) -> bool:
        """Whether some configuration was measured twice on a quiet machine, so that
        :meth:`noise` is this run's own, not the prior guess."""
        return any(len(latencies) > 1 for latencies in self._quiet_latencies().values())

    def _window_noise(self) -> float:
        errors = []
        for result in self._history.results.values():
            if is_quiet(result) and result.metrics is not None:
                steps = [math.log(s) for s in result.metrics.step_times_s if s > 0]
                if len(steps) > 1:
                    errors.append(statistics.stdev(steps) / math.sqrt(len(steps)))
        return statistics.median(errors) if errors else 0.0

    def _noise(self, with_control: bool) -> float:
        groups = self._quiet_latencies()
        if not with_control:
            groups.pop(self.control() or "", None)
        return measurement_noise(groups.values())

    def _quiet_latencies(self) -> dict[str, list[float]]:
        """Each configuration's latencies measured on a quiet machine
        (:func:`~autotune.tuner.noise.is_quiet`)."""
        groups: dict[str, list[float]] = {}
        for name, result in self._history.results.items():
            if is_quiet(result):
                assert result.metrics is not None
                groups.setdefault(self._history.config_of(name), []).append(result.metrics.latency)
        return groups

    def confirmation(self) -> str | None:
        """The leader's second measurement if it is in doubt (:meth:`doubted_leader`), else
        None."""
        leader = self.doubted_leader()
        return self._another(leader) if leader is not None else None

    def doubted_leader(self) -> str | None:
        """The leader, if it earns a second measurement: measured once and in doubt (step 1
        of the module docstring), or seen disturbed by the ranks (its value is a busy
        machine's). None: no doubt, nothing ran ok, or re-measuring is off."""
        if self._tuning.num_remeasure == 0:
            return None
        ranking = self._history.ranked(self._history.results.values(), self._tuning.metric)
        if not ranking:
            return None
        leader = ranking[0]
        if leader.disturbed:
            # Measured again where that can find the quiet machine: not while it is busy.
            return None if self.busy() else leader.name
        if leader.num_measurements > 1:
            return None
        rival = next((r for r in ranking[1:] if not r.disturbed), None)
        return leader.name if rival is not None and self._leader_in_doubt(leader, rival) else None

    def _leader_in_doubt(self, leader: Ranked, rival: Ranked) -> bool:
        """Whether the leader, measured once, earns a second measurement against its nearest
        rival: the rival could beat it beyond the tolerance by :data:`MAX_EXPECTED_LOSS` in
        expectation, or the lead is a surprise (:data:`SURPRISE_Z`)."""
        noise, lower = self.noise(), self._tuning.metric.lower_is_better
        if expected_loss(leader, rival, noise, lower) >= MAX_EXPECTED_LOSS:
            return True
        gap = math.log(leader.value) - math.log(rival.value)
        lead = -gap if lower else gap
        return lead > SURPRISE_Z * noise * math.sqrt(2)

    def next(self) -> str | None:
        """The next re-measurement worth running, or None: the answer stands."""
        if self._tuning.num_remeasure == 0:
            return None
        ranking = self._history.ranked(self._history.results.values(), self._tuning.metric)
        if not ranking:
            return None
        wanted = [
            self.confirmation(),
            self.control_due(every=CONTROL_AT_END),
            *(self._another(name) for name in self._rescues(ranking)),
            self._against_rivals(ranking),
        ]
        # One whose last measurement the ranks saw disturbed waits for the others: measured
        # again at once, it would most likely meet the same busy machine.
        candidates = [name for name in wanted if name is not None]
        candidates.sort(key=lambda name: self._last_disturbed(self._history.config_of(name)))
        return candidates[0] if candidates else None

    def _last_disturbed(self, name: str) -> bool:
        last = None
        for told in self._history.order:
            if self._history.config_of(told) == name:
                last = self._history.results[told]
        return last is not None and last.metrics is not None and last.metrics.disturbed

    def _against_rivals(self, ranking: list[Ranked]) -> str | None:
        """Step 2: the leader or the rival whose expected loss is largest, while any is at
        least :data:`MAX_EXPECTED_LOSS`."""
        short = short_windows(self._history)
        leader = ranking[0]
        if leader.name in short:
            return None
        noise = self.noise()
        lower = self._tuning.metric.lower_is_better
        # The control's repeats are the machine's check, not a contender's.
        remeasured = {n for n, c in self._counts().items() if c > 1} - {self.control()}
        threats = sorted(
            (
                (expected_loss(leader, r, noise, lower), r)
                for r in ranking[1:]
                if r.name not in short and not r.disturbed
            ),
            key=lambda pair: -pair[0],
        )
        for loss, rival in threats:
            if loss < MAX_EXPECTED_LOSS:
                break
            order = sorted((leader, rival), key=lambda r: (r.num_measurements, r is leader))
            for ranked in order:
                new = ranked.name not in remeasured
                if new and len(remeasured - {leader.name}) >= self._tuning.num_remeasure:
                    continue
                if (name := self._another(ranked.name)) is not None:
                    return name
        return None

    # --- the control and drift ----------------------------------------------------------------

    def control(self) -> str | None:
        """The first configuration the search proposed that ran ok and quiet: measured again
        through the run, it shows whether the machine changed where no rank could see it (a GPU's
        clocks, a slow start-up)."""
        results = self._history.results
        for name in self._history.proposed:
            if self._history.is_repeat(name) or name not in self._history.entries:
                continue
            if name not in results:
                return None  # decided once it is in, as a one-at-a-time run would
            result = results[name]
            # A window too short to measure in measures the machine's jitter, not its drift.
            window = result.timings.window_s  # 0: not timed (a runner that does not say)
            if is_quiet(result) and (window == 0 or window >= MIN_WINDOW_S):
                return name
        return None

    def control_due(self, every: int = CONTROL_EVERY) -> str | None:
        """The control's next measurement, once ``every`` search experiments ran since its
        last (None: not due, or no control yet)."""
        control = self.control()
        if control is None or self._tuning.num_remeasure == 0:
            return None
        names = self._history.proposed
        config_of = self._history.config_of
        last = max(i for i, n in enumerate(names) if config_of(n) == control)
        since = sum(1 for n in names[last + 1 :] if not self._history.is_repeat(n))
        if since < every:
            return None
        return self._another(control, bounded=False)

    def slowdowns(self) -> dict[str, float]:
        """Results taken while the control measured the machine slower than its fastest by
        more than the noise explains (:data:`DRIFT_Z` standard deviations of a difference),
        unseen by the ranks: each, by how much slower (those proposed between the control's
        neighbouring measurements)."""
        control = self.control()
        if control is None:
            return {}
        order = self._history.proposed
        results = self._history.results
        measured = [
            (i, results[n].metrics.latency)  # type: ignore[union-attr]
            for i, n in enumerate(order)
            if self._history.config_of(n) == control and n in results and is_quiet(results[n])
        ]
        if len(measured) < 2:
            return {}
        fastest = min(latency for _, latency in measured)
        # The noise those very slow stretches inflate is capped: a drift that large is seen.
        noise = min(self._noise(with_control=False), MAX_DRIFT_NOISE)
        line = math.exp(DRIFT_Z * noise * math.sqrt(2))
        slow: dict[str, float] = {}
        for k, (_, latency) in enumerate(measured):
            if latency <= fastest * line:
                continue
            start = measured[k - 1][0] + 1 if k > 0 else 0
            end = measured[k + 1][0] if k + 1 < len(measured) else len(order)
            for name in order[start:end]:
                slow[name] = max(slow.get(name, 1.0), latency / fastest)
        return slow

    # --- a busy machine's measurements --------------------------------------------------------

    def busy(self) -> bool:
        """Whether the machine is busy throughout (:func:`~autotune.tuner.busy.busy`)."""
        return busy(self._history, self._quiet_at)

    def waits_for_quiet(self) -> bool:
        """Whether the machine is busy (:meth:`busy`) and a quiet one would measure again
        what it decided: a leader or a contender measured only disturbed."""
        if not self.busy() or self._tuning.num_remeasure == 0:
            return False
        ranking = self._history.ranked(self._history.results.values(), self._tuning.metric)
        return bool(ranking) and (ranking[0].disturbed or bool(self._rescues(ranking, True)))

    def _rescues(self, ranking: list[Ranked], even_if_busy: bool = False) -> list[str]:
        """Step 3: configurations whose standing a busy machine decided, and whose quiet
        value could make them their variant's best or beat the leader: measured only while
        the ranks saw other processes compete (until one quiet measurement, which then ranks
        alone), or taken while the control saw the machine slow (until the quiet ones
        outnumber the slow, so that the median is the quiet machine's). None while the
        machine is busy (unless ``even_if_busy``)."""
        if self.busy() and not even_if_busy:
            return []  # measured again now, they would meet the same busy machine
        history, metric = self._history, self._tuning.metric
        slowdowns = self.slowdowns()
        bounds: dict[str, float] = {}
        seen: Counter[str] = Counter()
        slowed: Counter[str] = Counter()
        quiet: Counter[str] = Counter()
        for name, result in history.results.items():
            base = history.config_of(name)
            if not result.ok or result.metrics is None or base not in history.entries:
                continue
            factor = slowdowns.get(name, 1.0)
            if result.metrics.disturbed:
                seen[base] += 1
                factor = max(factor, 1.0 + (result.metrics.oversubscription or 0.0))
            elif name in slowdowns:
                slowed[base] += 1
            else:
                quiet[base] += 1
            value = score(result.metrics, metric)
            bound = value * factor if value > 0 else value / factor
            bounds[base] = max(bounds.get(base, float("-inf")), bound)

        def spoiled(base: str) -> bool:
            return (quiet[base] == 0 and seen[base] > 0) or 0 < slowed[base] >= quiet[base]

        quiet_best: dict[object, float] = {}
        for r in ranking:
            if not spoiled(r.name):
                quiet_best.setdefault(history.entries[r.name].variant, metric.score(r.value))
        leader = metric.score(ranking[0].value)
        rescues = []
        for r in ranking:
            if not spoiled(r.name):
                continue
            variant_best = quiet_best.get(history.entries[r.name].variant)
            if variant_best is None or bounds[r.name] > variant_best or bounds[r.name] > leader:
                rescues.append(r.name)
        return rescues

    # --- bookkeeping --------------------------------------------------------------------------

    def _counts(self, informative: bool = False) -> Counter[str]:
        """Measurements of each configuration, run or in flight, failed ones included
        (``informative``: leaving out those the ranks saw disturbed, which rank only where
        nothing else does)."""
        counts: Counter[str] = Counter()
        for name, result in self._history.results.items():
            disturbed = result.metrics is not None and result.metrics.disturbed
            if not (informative and result.ok and disturbed):
                counts[self._history.config_of(name)] += 1
        counts.update(self._history.config_of(n) for n in self._history.pending)
        return counts

    def _another(self, name: str, bounded: bool = True) -> str | None:
        """``name``'s next repeat, unless it has :data:`MAX_MEASUREMENTS` informative ones
        (twice that in all) already; ``bounded`` False: the control, measured through the
        run."""
        total = self._counts()[name]
        # While the machine is busy a measurement is most likely disturbed again: the bound
        # counts every measurement, not only the quiet ones (which may never come).
        limit = MAX_MEASUREMENTS if self.busy() else 2 * MAX_MEASUREMENTS
        if bounded and (self._counts(informative=True)[name] >= MAX_MEASUREMENTS or total >= limit):
            return None
        repeat = self._history.next_repeat(name)
        return repeat if self._history.is_free(repeat) else None
