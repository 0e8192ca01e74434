"""A verdict per revision: what `GET /v1/verdict` and the Flagger webhooks answer.

A revision is what the switch's arm serves (a pod-template hash, a Flagger checksum, a git
sha). Evidence belongs to one revision: its window starts only when an explicit write opens
it (`open_revision`: Flagger's `pre-rollout` or `rollout` hook, `POST /v1/verdict`, or
`switch.revision` in the config, which the gate job opens) and ends where the arm's next
revision starts, so the pairs measured before it never judge it. A read never writes: a
revision nobody opened reads NODATA and creates nothing. At most `MAX_REVISIONS` windows
are kept per arm; opening one more forgets the oldest. `VerdictService.judge` runs every gate
(`gates.cycle.judge`, pure) over the arm's pairs in that window (and, with `[telemetry]`,
both arms' scrape intervals in it), cut at the leader's last
completed gate run (`evaluated_at`): a verdict is as current as the gates' own judging, and
canaryd refuses to judge (`CannotJudgeError`) when the database is away or that run is
older than the freshness bound (`gates.policy.evidence_max_age_seconds`, the bound a
restore's evidence has). `gates.cycle.combine` turns the enforce gates' decisions into one verdict:
FAIL when any FAILs, PASS when all PASS on at least `min_pairs` pairs, NODATA when too few
pairs decide anything, INCONCLUSIVE otherwise (WARN included). A revision's FAIL latches
(`canaryd.judging.latch`): once it FAILed, or the switch rolled speculation back while it
was judged, it reads FAIL with that time and reason until the arm's next revision opens or
an operator restores; the writes (`judge(start=True)`, `increase`, the gate job's
`latch_current`) record it. A verdict is `fresh` only while the arm serves its revision
and a gate run has completed since its evidence started. Every verdict carries `estimate`:
the pairs and minutes still needed for a decision at the pair rate of the moment (the
daemon's `pace`, a rollout burst's while one runs); its body is `canaryd.judging.
revision_verdict`. `increase` answers Flagger's `confirm-traffic-increase` by the rule of
`canaryd.judging.increase` and marks each increase it allows.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import structlog

from canaryd.config import Settings
from canaryd.errors import BadRequestError, CannotJudgeError, DatabaseError
from canaryd.judging.increase import SinceIncrease, hold_reason, since_increase
from canaryd.judging.latch import (
    Failure,
    first_failure,
    latched_reason,
    switch_failure,
    window_failure,
)
from canaryd.judging.rate import pair_rate
from canaryd.judging.reader import gather
from canaryd.judging.revision_verdict import COMPACT_MAX_BYTES, RevisionVerdict, finite
from canaryd.redact import redact_value
from canaryd.store import RevisionWindow, SqlStore, Store
from gates import SwitchState
from gates.config import GatesConfig
from gates.cycle import Judgement, Verdict, judge
from gates.records import BASELINE_ARM, PairRecord

__all__ = [
    "COMPACT_MAX_BYTES",
    "RevisionVerdict",
    "Verdict",
    "VerdictQuery",
    "VerdictService",
    "finite",
]

log = structlog.get_logger(__name__)

# Evidence windows kept per arm: opening one more forgets the oldest (retention forgets
# ended ones after `storage.raw_retention_days` anyway).
MAX_REVISIONS = 100
# How much of a client's unknown value a reason repeats.
ECHO_CHARS = 64

# Verdicts kept per (query, gate run, window, settings): a rollout tool polling between two
# gate runs costs two small reads, not a read and evaluation of the whole window.
CACHED_VERDICTS = 64


@dataclass(frozen=True, slots=True)
class VerdictQuery:
    """Which revision to judge, on at least how many pairs, of which category (None: all)."""

    revision: str
    min_pairs: int = 0
    category: str | None = None


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _fresh_run(completed: datetime | None, bound: float, now: datetime) -> datetime:
    """When the last gate run completed; `CannotJudgeError` when none has, or longer
    than `bound` seconds ago (`gates.policy.evidence_max_age_seconds`)."""
    if completed is None:
        raise CannotJudgeError(
            "no gate run has completed yet: is a daemon leading the gates on this "
            "database (`canaryd status`)?"
        )
    if (now - completed).total_seconds() > bound:
        raise CannotJudgeError(
            f"the last gate run completed {(now - completed).total_seconds():.0f} s ago, "
            f"beyond the freshness bound of {bound:g} s "
            "(gates.policy.evidence_max_age_seconds): no daemon is judging"
        )
    return completed


def _check_category(store: Store, category: str) -> None:
    """`BadRequestError` for a category the store has never seen, naming the known ones."""
    known = store.categories()
    if category not in known:
        shown = ", ".join(known[:20]) + (f" (+{len(known) - 20} more)" if len(known) > 20 else "")
        raise BadRequestError(
            "category",
            f"unknown category {category[:ECHO_CHARS]!r}; known: {shown or 'none'}",
        )


def _unopened(served: str | None, revision: str) -> str:
    """Why `revision` has no evidence window yet, and how one is opened."""
    opener = (
        "the gate job opens it at its next run (switch.revision)"
        if served is not None
        else "open it with Flagger's pre-rollout or rollout hook or POST "
        f"/v1/verdict?revision={revision}"
    )
    return f"no evidence window is open for revision {revision!r}: {opener}"


class VerdictService:
    """Judges revisions of the switch's arm from the store, as the daemon's gates would.

    `settings` is the daemon's `Settings` or a callable returning the current ones (a
    SIGHUP reload's thresholds and `switch.revision` apply). `store` is opened from
    `storage.url` on first use when not given, and closed by `close()` only then. `pace`
    answers the pairs per minute running now (the daemon's; default: the schedule's).
    """

    def __init__(
        self,
        settings: Settings | Callable[[], Settings],
        *,
        store: Store | None = None,
        clock: Callable[[], datetime] = _utcnow,
        pace: Callable[[], float] | None = None,
    ) -> None:
        self._settings = settings
        self._pace = pace
        self._store = store
        self._owns_store = store is None
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: OrderedDict[Hashable, RevisionVerdict] = OrderedDict()

    @property
    def settings(self) -> Settings:
        return self._settings() if callable(self._settings) else self._settings

    def pairs_per_minute(self) -> float:
        """The pair rate now: the daemon's `pace`, else the schedule's."""
        if self._pace is not None:
            return self._pace()
        return self.settings.schedule.pairs_per_minute

    def rated(self, verdict: RevisionVerdict) -> RevisionVerdict:
        """`verdict` with its estimate at the pair rate of this moment."""
        return replace(verdict, pairs_per_minute=self.pairs_per_minute())

    def _opened(self) -> Store:
        with self._lock:
            if self._store is None:
                self._store = SqlStore.open(self.settings.storage.resolved_url())
            return self._store

    def close(self) -> None:
        with self._lock:
            if self._store is not None and self._owns_store:
                self._store.close()
            self._store = None

    def judge(self, query: VerdictQuery, *, start: bool = False) -> RevisionVerdict:
        """The verdict of `query.revision`. With `start` (an authenticated write: a Flagger
        hook, `POST /v1/verdict`) its window is opened first when none is, and a FAIL is
        latched in it; without, nothing is written, and a revision nobody opened reads
        NODATA.

        Raises `CannotJudgeError` when the database is away or no gate run completed within
        the freshness bound, `BadRequestError` for a category the store has never seen."""
        try:
            if start:
                self._open(query.revision)
            verdict = self.rated(self._judge(query))
            if start:
                self._latch(verdict)
            return verdict
        except DatabaseError as exc:
            raise CannotJudgeError(f"the database is away: {exc}") from exc

    def increase(self, query: VerdictQuery) -> tuple[RevisionVerdict, str | None]:
        """Flagger's `confirm-traffic-increase`, a write: the verdict of `query.revision`
        (a FAIL latched) and why its traffic must not grow now (`canaryd.judging.increase`);
        None when it may, and then the increase is marked at the verdict's `evaluated_at`:
        the next one needs evidence measured after it. Raises as `judge`."""
        try:
            verdict = self.rated(self._judge(query))
            self._latch(verdict)
            hold = self._hold(verdict)
            if hold is None:
                self._opened().mark_increase(
                    self.settings.switch_arm, verdict.revision, verdict.evaluated_at
                )
            return verdict, hold
        except DatabaseError as exc:
            raise CannotJudgeError(f"the database is away: {exc}") from exc

    def _hold(self, verdict: RevisionVerdict) -> str | None:
        judgement, since = verdict.judgement, verdict.since_increase
        if verdict.verdict == "NODATA" or judgement is None or since is None:
            return f"nothing is decided yet: {verdict.reason}"
        return hold_reason(
            verdict.verdict,
            verdict.fresh,
            verdict.gates,
            judgement.covered,
            since,
            verdict.gates_config or self.settings.gates,
            self.settings.rollout.increase_evidence_share,
        )

    def latch_current(
        self, at: datetime, gate_run: Judgement | None = None, since: datetime | None = None
    ) -> RevisionVerdict | None:
        """The gate job, after its run of `at` completed: latch the FAIL of the revision the
        switch's arm serves now, judged on its own evidence, or `gate_run`'s (the gate
        job's own judgement, on the evidence from `since`) when all of that evidence lies
        in the revision's. Returns the verdict judged (None: no revision, or its FAIL is
        latched already). Raises `DatabaseError` and `CannotJudgeError`."""
        store = self._opened()
        arm = self.settings.switch_arm
        window = store.current_revision(arm)
        if window is None or window.failed_at is not None:
            return None
        if (
            gate_run is not None
            and gate_run.verdict == "FAIL"
            and since is not None
            and since >= window.evidence_start
        ):
            reason = f"the gate run at {at.isoformat(timespec='seconds')}: {gate_run.reason}"
            if store.latch_revision(arm, window.revision, at, reason):
                self._logged(window.revision, Failure(at, reason))
            return None
        verdict = self._judge(VerdictQuery(window.revision))
        self._latch(verdict)
        return verdict

    def _latch(self, verdict: RevisionVerdict) -> None:
        """Record `verdict`'s FAIL in its window when it is not latched there yet."""
        failure = verdict.failure
        if failure is None or verdict.latched:
            return
        store = self._opened()
        if store.latch_revision(
            self.settings.switch_arm, verdict.revision, failure.at, failure.reason
        ):
            self._logged(verdict.revision, failure)

    def _logged(self, revision: str, failure: Failure) -> None:
        log.warning(
            "verdict.fail_latched",
            arm=self.settings.switch_arm,
            revision=revision,
            failed_at=failure.at.isoformat(),
            reason=failure.reason,
        )

    def open_revision(self, revision: str) -> RevisionWindow:
        """Open the evidence window of `revision` of the switch's arm now, ending the arm's
        current one; a revision already opened keeps its window. Raises `CannotJudgeError`
        when the database is away, `BadRequestError` when the config pins another revision
        (`switch.revision`)."""
        try:
            return self._open(revision)
        except DatabaseError as exc:
            raise CannotJudgeError(f"the database is away: {exc}") from exc

    def _open(self, revision: str) -> RevisionWindow:
        settings = self.settings
        served = settings.switch.revision
        if served is not None and revision != served:
            raise BadRequestError(
                "revision",
                f"the speculative arm serves revision {served!r} (switch.revision); "
                "another revision's window cannot be opened",
            )
        store = self._opened()
        arm = settings.switch_arm
        window = store.revision_window(arm, revision)
        if window is None:
            window = store.start_revision(arm, revision, self._clock(), keep=MAX_REVISIONS)
            log.info(
                "verdict.revision_started",
                arm=arm,
                revision=revision,
                started_at=window.started_at.isoformat(),
            )
        return window

    def _judge(self, query: VerdictQuery) -> RevisionVerdict:
        settings = self.settings
        store = self._opened()
        now = self._clock()
        record = store.switch()
        completed = _fresh_run(
            record.gates_completed_at, settings.gates.policy.evidence_max_age_seconds, now
        )
        if query.category is not None:
            _check_category(store, query.category)
        arm = settings.switch_arm
        revision = query.revision
        state = record.state

        def answer(
            verdict: Verdict,
            reason: str,
            *,
            at: datetime = completed,
            fresh: bool = False,
            current: bool = False,
            records: Sequence[PairRecord] = (),
            judgement: Judgement | None = None,
            config: GatesConfig = settings.gates,
            since: SinceIncrease | None = None,
        ) -> RevisionVerdict:
            return RevisionVerdict(
                verdict=verdict,
                fresh=fresh,
                evaluated_at=at,
                age_s=max(0.0, (now - at).total_seconds()),
                revision=revision,
                pairs=len(records),
                arms=self._arms(store, arm, records),
                speculative_enabled=state.speculative_enabled,
                generation=state.generation,
                reason=reason,
                gates=judgement.decisions if judgement is not None else (),
                window_current=current,
                judgement=judgement,
                gates_config=config,
                min_pairs=query.min_pairs,
                since_increase=since,
            )

        served = settings.switch.revision
        if served is not None and revision != served:
            return answer(
                "NODATA",
                f"the speculative arm serves revision {served!r} (switch.revision), not "
                f"{revision!r}: no evidence is kept for it",
            )
        window = store.revision_window(arm, revision)
        if window is None:
            return answer("NODATA", _unopened(served, revision))
        failure = first_failure(
            window_failure(window), switch_failure(window, store.audit(since=window.evidence_start))
        )
        if completed < window.evidence_start:
            judged = answer(
                "NODATA",
                f"the evidence of revision {revision!r} started at "
                f"{window.evidence_start.isoformat(timespec='seconds')}; no gate run has "
                f"completed since (one runs every {settings.schedule.gate_interval_s:g} s)",
                current=window.current,
            )
        else:
            judged = self._judge_window(
                store, settings, query, window, completed, now, state, answer
            )
        return _superseded(_latched(judged, failure, window), window)

    def _judge_window(
        self,
        store: Store,
        settings: Settings,
        query: VerdictQuery,
        window: RevisionWindow,
        completed: datetime,
        now: datetime,
        state: SwitchState,
        answer: Callable[..., RevisionVerdict],
    ) -> RevisionVerdict:
        """The verdict on `window`'s evidence, as of the last completed gate run (or the
        window's end), from the cache when nothing it rests on has changed."""
        revision = query.revision
        at = completed if window.ended_at is None else min(completed, window.ended_at)
        key = (query, at, window, settings.config_hash())
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None:
            return replace(
                cached,
                age_s=max(0.0, (now - at).total_seconds()),
                speculative_enabled=state.speculative_enabled,
                generation=state.generation,
            )
        evidence = gather(
            store,
            settings,
            settings.switch_arm,
            at,
            window=window,
            category=query.category,
            rate=pair_rate,
            subject=f"revision {revision!r}",
        )
        judged = judge(evidence, settings.gates, at, min_pairs=query.min_pairs)
        answered = answer(
            judged.verdict,
            judged.reason,
            at=at,
            fresh=window.current,
            current=window.current,
            records=evidence.records,
            judgement=judged,
            config=evidence.judged_config(settings.gates),
            since=since_increase(evidence, window, at),
        )
        with self._lock:
            self._cache[key] = answered
            while len(self._cache) > CACHED_VERDICTS:
                self._cache.popitem(last=False)
        return answered

    @staticmethod
    def _arms(store: Store, arm: str, records: Sequence[PairRecord]) -> dict[str, Any]:
        """The identities of the baseline and `arm`, from the run of the newest pair judged
        (else the latest run); credentials in them masked."""
        run = None
        if records:
            run = store.runs_by_id([records[-1].run_id]).get(records[-1].run_id)
        if run is None:
            latest = store.runs(limit=1)
            run = latest[0] if latest else None
        if run is None:
            return {}
        info = run.info
        identities = {
            BASELINE_ARM: info.baseline_identity,
            arm: info.arm_identities.get(arm, info.speculative_identity),
        }
        masked: dict[str, Any] = redact_value(identities)
        return masked


def _latched(
    verdict: RevisionVerdict, failure: Failure | None, window: RevisionWindow
) -> RevisionVerdict:
    """`verdict` under the revision's FAIL latch: FAIL with the first failure's time and
    reason when one stands (`failure`, stored in `window` or the switch's rollback), else
    a FAIL judged now is the failure."""
    if failure is None:
        if verdict.verdict != "FAIL":
            return verdict
        return replace(verdict, failure=Failure(verdict.evaluated_at, verdict.reason))
    return replace(
        verdict,
        verdict="FAIL",
        reason=latched_reason(failure, verdict.reason),
        failure=failure,
        latched=window.failed_at is not None and window.failed_at == failure.at,
    )


def _superseded(verdict: RevisionVerdict, window: RevisionWindow) -> RevisionVerdict:
    """`verdict` of a superseded revision says so, and that it is its final one."""
    if window.ended_at is None:
        return verdict
    return replace(
        verdict,
        reason=f"revision {verdict.revision!r} was superseded at "
        f"{window.ended_at.isoformat(timespec='seconds')}; its final verdict: {verdict.reason}",
    )
