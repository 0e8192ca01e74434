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
pairs decide anything, INCONCLUSIVE otherwise (WARN included). A verdict is `fresh` only
while the arm serves its revision and a gate run has completed since its window started.
Every verdict carries `estimate`: the pairs and minutes still needed for a decision at the
pair rate of the moment (the daemon's `pace`, a rollout burst's while one runs); `as_json`
gives the whole body or, `compact`, one under `COMPACT_MAX_BYTES` for a rollout tool's
measurement history.
"""

from __future__ import annotations

import json
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import structlog

from canaryd.config import Settings
from canaryd.errors import BadRequestError, CannotJudgeError, DatabaseError
from canaryd.judging.rate import pair_rate
from canaryd.judging.reader import gather
from canaryd.redact import redact_value
from canaryd.store import RevisionWindow, SqlStore, Store
from gates import GateDecision, SwitchState
from gates.config import GatesConfig
from gates.cycle import Judgement, Verdict, judge
from gates.estimate import estimate as estimate_need
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

# `?view=compact`: Argo keeps every measurement's body in the AnalysisRun's status, so the
# compact body stays under this many bytes whatever the revision and the reason.
COMPACT_MAX_BYTES = 1000
COMPACT_REASON_CHARS = 160


def estimate(
    judgement: Judgement | None,
    config: GatesConfig | None,
    pairs_per_minute: float | None,
    *,
    min_pairs: int = 0,
) -> dict[str, Any]:
    """`pairs_to_decision` and `minutes_to_decision` at `pairs_per_minute`
    (`gates.estimate`), and the check `waiting_on`: 0 once the verdict decided (PASS or
    FAIL); None where no bound on what is still needed is known or no pair runs."""
    if judgement is None or config is None:
        return {"pairs_to_decision": None, "minutes_to_decision": None, "waiting_on": None}
    if judgement.verdict in ("PASS", "FAIL"):
        return {"pairs_to_decision": 0, "minutes_to_decision": 0.0, "waiting_on": None}
    need = estimate_need(judgement, config, pairs_per_minute=pairs_per_minute, min_pairs=min_pairs)
    return need.to_dict()


@dataclass(frozen=True, slots=True)
class VerdictQuery:
    """Which revision to judge, on at least how many pairs, of which category (None: all)."""

    revision: str
    min_pairs: int = 0
    category: str | None = None


@dataclass(frozen=True, slots=True)
class RevisionVerdict:
    """One revision's verdict with everything behind it (`as_json` is the HTTP body)."""

    verdict: Verdict
    fresh: bool
    evaluated_at: datetime
    age_s: float
    revision: str
    pairs: int
    arms: dict[str, Any]
    speculative_enabled: bool
    generation: int
    reason: str
    gates: tuple[GateDecision, ...] = ()
    # The pair rate of the moment, for `estimate` (None: no pair runs).
    pairs_per_minute: float | None = None
    # The rollout burst's cost on this revision (`canaryd.daemon.burst`), None without one.
    burst: dict[str, Any] | None = None
    # Whether the revision's window is open and not superseded (not part of the body).
    window_current: bool = False
    judgement: Judgement | None = field(default=None, compare=False, repr=False)
    gates_config: GatesConfig | None = field(default=None, compare=False, repr=False)
    min_pairs: int = 0

    @property
    def decided(self) -> bool:
        return self.verdict in ("PASS", "FAIL")

    def estimate(self) -> dict[str, Any]:
        """`pairs_to_decision`, `minutes_to_decision` at the current pair rate, and the
        check `waiting_on`."""
        if self.decided:
            return {"pairs_to_decision": 0, "minutes_to_decision": 0.0, "waiting_on": None}
        return estimate(
            self.judgement, self.gates_config, self.pairs_per_minute, min_pairs=self.min_pairs
        )

    def as_json(self, view: str = "full") -> dict[str, Any]:
        """The `/v1/verdict` body: these fields exactly, no non-finite number (null);
        `compact`: verdict, fresh, revision, pairs, a short reason and the estimate, in
        under `COMPACT_MAX_BYTES` of JSON."""
        if view == "compact":
            return self._compact()
        body = {
            "verdict": self.verdict,
            "fresh": self.fresh,
            "evaluated_at": self.evaluated_at.isoformat(),
            "age_s": round(self.age_s, 3),
            "revision": self.revision,
            "pairs": self.pairs,
            "arms": self.arms,
            "speculative_enabled": self.speculative_enabled,
            "generation": self.generation,
            "reason": self.reason,
            "estimate": self.estimate(),
            "burst": self.burst,
            "gates": [decision.to_dict() for decision in self.gates],
        }
        cleaned: dict[str, Any] = finite(body)
        return cleaned

    def _compact(self) -> dict[str, Any]:
        reason = self.reason
        if len(reason) > COMPACT_REASON_CHARS:
            reason = reason[: COMPACT_REASON_CHARS - 1] + "…"
        while True:
            body: dict[str, Any] = finite(
                {
                    "verdict": self.verdict,
                    "fresh": self.fresh,
                    "revision": self.revision,
                    "pairs": self.pairs,
                    "reason": reason,
                    "estimate": self.estimate(),
                }
            )
            size = len(json.dumps(body, sort_keys=True, allow_nan=False).encode())
            if size < COMPACT_MAX_BYTES or not reason:
                return body
            reason = reason[: len(reason) // 2] + "…" if len(reason) > 1 else ""


def finite(value: Any) -> Any:
    """`value` with every non-finite float, however deeply nested, replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


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
        hook, `POST /v1/verdict`) its window is opened first when none is; without, nothing
        is written, and a revision nobody opened reads NODATA.

        Raises `CannotJudgeError` when the database is away or no gate run completed within
        the freshness bound, `BadRequestError` for a category the store has never seen."""
        try:
            if start:
                self._open(query.revision)
            return self.rated(self._judge(query))
        except DatabaseError as exc:
            raise CannotJudgeError(f"the database is away: {exc}") from exc

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
        if completed < window.started_at:
            return answer(
                "NODATA",
                f"the evidence window of revision {revision!r} started at "
                f"{window.started_at.isoformat(timespec='seconds')}; no gate run has completed "
                f"since (one runs every {settings.schedule.gate_interval_s:g} s)",
                current=window.current,
            )
        return self._judge_window(store, settings, query, window, completed, now, state, answer)

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
        verdict, reason = judged.verdict, judged.reason
        if window.ended_at is not None:
            reason = (
                f"revision {revision!r} was superseded at "
                f"{window.ended_at.isoformat(timespec='seconds')}; its final verdict: {reason}"
            )
        answered = answer(
            verdict,
            reason,
            at=at,
            fresh=window.current,
            current=window.current,
            records=evidence.records,
            judgement=judged,
            config=evidence.judged_config(settings.gates),
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
