"""A verdict per revision: what `GET /v1/verdict` and the Flagger webhooks answer.

A revision is what the switch's arm serves (a pod-template hash, a Flagger checksum, a git
sha). Evidence belongs to one revision: its window starts at the first request that names
it (`SwitchStore.start_revision`) and ends where the arm's next revision starts, so the
pairs measured before it never judge it. `VerdictService.judge` runs every gate
(`gates.evaluate_all`, pure) over the arm's pairs in that window, cut at the leader's last
completed gate run (`evaluated_at`): a verdict is as current as the gates' own judging, and
canaryd refuses to judge (`CannotJudgeError`) when the database is away or that run is
older than the freshness bound (`gates.policy.evidence_max_age_seconds`, the bound a
restore's evidence has). `combine` turns the enforce gates' decisions into one verdict:
FAIL when any FAILs, PASS when all PASS on at least `min_pairs` pairs, NODATA when too few
pairs decide anything, INCONCLUSIVE otherwise (WARN included). A verdict is `fresh` only
while the arm serves its revision and a gate run has completed since its window started.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal

import structlog

from canaryd.assembly import arm_pair_config, arms_key
from canaryd.config import Settings
from canaryd.errors import BadRequestError, CannotJudgeError, DatabaseError
from canaryd.gating import under_current_arms, window_bounds
from canaryd.redact import redact_value
from canaryd.store import RevisionWindow, SqlStore, Store
from canaryd.switch.actuators import utcnow
from gates import GateDecision, GateState, evaluate_all
from gates.core import combine_states
from gates.records import BASELINE_ARM, PairRecord

__all__ = [
    "RevisionVerdict",
    "Verdict",
    "VerdictQuery",
    "VerdictService",
    "combine",
    "finite",
]

log = structlog.get_logger(__name__)

# Verdicts kept per (query, gate run, window, settings): a rollout tool polling between two
# gate runs costs two small reads, not a read and evaluation of the whole window.
CACHED_VERDICTS = 64

Verdict = Literal["PASS", "FAIL", "INCONCLUSIVE", "NODATA"]


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

    def as_json(self) -> dict[str, Any]:
        """The `/v1/verdict` body: these fields exactly, no non-finite number (null)."""
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
            "gates": [decision.to_dict() for decision in self.gates],
        }
        cleaned: dict[str, Any] = finite(body)
        return cleaned


def finite(value: Any) -> Any:
    """`value` with every non-finite float, however deeply nested, replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


def _one_line(text: str) -> str:
    return " ".join(text.split())


def combine(
    decisions: Sequence[GateDecision], pairs: int, min_pairs: int, subject: str
) -> tuple[Verdict, str]:
    """The verdict of the enforce gates' `decisions` on `pairs` pairs of `subject` (e.g.
    "revision 'abc'"), and why in one line.

    A FAIL is a detector's alarm under its false-alarm budget and stands however few pairs
    raised it; `min_pairs` only holds back the other verdicts (NODATA below it)."""
    enforced = [d for d in decisions if d.enforced]
    if not enforced:
        return "NODATA", f"no gate is in enforce mode: nothing judges {subject}"
    failed = [d for d in enforced if d.state is GateState.FAIL]
    if failed:
        first = min(failed, key=lambda d: not d.critical)  # a critical gate's reason first
        names = ", ".join(d.name for d in failed)
        return "FAIL", _one_line(f"{names} FAILed on {pairs} pairs of {subject}: {first.detail}")
    if pairs < min_pairs:
        return "NODATA", f"{pairs} pairs of {subject}, fewer than min_pairs={min_pairs}"
    state = combine_states([d.state for d in enforced])
    if state is GateState.PASS:
        return "PASS", f"every enforce gate PASSed on {pairs} pairs of {subject}"
    if state is GateState.NODATA:
        return "NODATA", f"too few pairs of {subject} for any enforce gate to decide ({pairs})"
    undecided = ", ".join(
        f"{d.name} {d.state.value}" for d in enforced if d.state is not GateState.PASS
    )
    return "INCONCLUSIVE", f"not decided on {pairs} pairs of {subject}: {undecided}"


class VerdictService:
    """Judges revisions of the switch's arm from the store, as the daemon's gates would.

    `settings` is the daemon's `Settings` or a callable returning the current ones (a
    SIGHUP reload's thresholds and `switch.revision` apply). `store` is opened from
    `storage.url` on first use when not given, and closed by `close()` only then.
    """

    def __init__(
        self,
        settings: Settings | Callable[[], Settings],
        *,
        store: Store | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._settings = settings
        self._store = store
        self._owns_store = store is None
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: OrderedDict[Hashable, RevisionVerdict] = OrderedDict()

    @property
    def settings(self) -> Settings:
        return self._settings() if callable(self._settings) else self._settings

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

    def judge(self, query: VerdictQuery) -> RevisionVerdict:
        """The verdict of `query.revision`; starts its window when no request named it yet.

        Raises `CannotJudgeError` when the database is away or no gate run completed within
        the freshness bound, `BadRequestError` for a category the store has never seen."""
        try:
            return self._judge(query)
        except DatabaseError as exc:
            raise CannotJudgeError(f"the database is away: {exc}") from exc

    def _judge(self, query: VerdictQuery) -> RevisionVerdict:
        settings = self.settings
        store = self._opened()
        now = self._clock()
        record = store.switch()
        completed = record.gates_completed_at
        bound = settings.gates.policy.evidence_max_age_seconds
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
        if query.category is not None:
            known = store.categories()
            if query.category not in known:
                raise BadRequestError(
                    "category",
                    f"unknown category {query.category!r}; known: {', '.join(known) or 'none'}",
                )
        arm = settings.switch_arm
        revision = query.revision
        state = record.state

        def answer(
            verdict: Verdict,
            reason: str,
            *,
            at: datetime = completed,
            fresh: bool = False,
            records: Sequence[PairRecord] = (),
            gates: Sequence[GateDecision] = (),
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
                gates=tuple(gates),
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
            window = store.start_revision(arm, revision, now)
            log.info(
                "verdict.revision_started",
                arm=arm,
                revision=revision,
                started_at=window.started_at.isoformat(),
            )
        if completed < window.started_at:
            return answer(
                "NODATA",
                f"the evidence window of revision {revision!r} started at "
                f"{window.started_at.isoformat(timespec='seconds')}; no gate run has completed "
                f"since (one runs every {settings.schedule.gate_interval_s:g} s)",
            )
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
        records = self._records(store, settings, arm, window, at, query.category)
        references = store.drift_references(
            arms_key(arm_pair_config(settings.snapshot().get("arms"), arm))
        )
        decisions = evaluate_all(
            records, settings.gates, now=at, references=references, since=window.started_at
        )
        verdict, reason = combine(
            decisions, len(records), query.min_pairs, f"revision {revision!r}"
        )
        if window.ended_at is not None:
            reason = (
                f"revision {revision!r} was superseded at "
                f"{window.ended_at.isoformat(timespec='seconds')}; its final verdict: {reason}"
            )
        judged = answer(
            verdict, reason, at=at, fresh=window.current, records=records, gates=decisions
        )
        with self._lock:
            self._cache[key] = judged
            while len(self._cache) > CACHED_VERDICTS:
                self._cache.popitem(last=False)
        return judged

    @staticmethod
    def _records(
        store: Store,
        settings: Settings,
        arm: str,
        window: RevisionWindow,
        at: datetime,
        category: str | None,
    ) -> list[PairRecord]:
        """The pairs of `arm` in the revision's window up to `at`, within the longest gate
        window, measured under the arms configured now, of `category` when given."""
        seconds, limit = window_bounds(settings.gates)
        since = window.started_at
        if seconds is not None:
            since = max(since, at - timedelta(seconds=seconds))
        until = at + timedelta(microseconds=1)
        if window.ended_at is not None:
            until = min(until, window.ended_at)
        records = store.pairs(since=since, until=until, limit=limit, arm=arm, category=category)
        return under_current_arms(settings, store, records, arm)

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
