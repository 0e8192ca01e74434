"""Every seam of the store in one place: what the daemon, gates job, switch service,
report and CLI need from canaryd's history, as protocols.

`HistoryStore` is where pairs, runs and roll-ups live; `SwitchStore` is the durable
switch state, its audit trail, gate evaluations, drift references and the evidence windows
of revisions; `TelemetryStore` keeps the arms' production telemetry, one row per arm and
scrape interval; `CalibrationStore` the tie margin calibrated per arms key; `Store` is all
of them, which is what `SqlStore` implements (on SQLite and
PostgreSQL alike, tested by one behaviour suite). Consumers are typed on the narrowest
protocol they use, never on `SqlStore`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from canaryd.store.rollup import PairFacts, PairRollup
from canaryd.store.serving import SERVING_ROW_LIMIT, ServingFacts
from canaryd.store.switching import AuditEntry, RevisionWindow, SwitchRecord
from gates import Evaluation, ReferenceStats, SwitchOutcome, SwitchState
from gates.records import DEFAULT_ARM, PairRecord, RunInfo
from gates.telemetry.intervals import TelemetryInterval

__all__ = [
    "RETENTION_BATCH_PAIRS",
    "CalibrationStore",
    "History",
    "HistoryStore",
    "RetentionReport",
    "Store",
    "StoredInterval",
    "StoredRun",
    "SwitchStore",
    "TelemetryStore",
    "TieMargin",
]

# Pairs rolled up per retention transaction: a months-long backlog never holds one giant
# transaction (or SQLite's single write lock) while the daemon wants to save a pair.
RETENTION_BATCH_PAIRS = 1000


@dataclass(frozen=True, slots=True)
class StoredRun:
    """A run as stored: what it was started with, and when it finished (None: still running
    or killed)."""

    info: RunInfo
    finished_at: datetime | None

    @property
    def switch_arm(self) -> str:
        """The speculative arm the run's switch controlled: its `switch.arm`, else its one
        speculative arm (`speculative` for runs from before arms had names)."""
        switch = self.info.config.get("switch")
        named = switch.get("arm") if isinstance(switch, dict) else None
        if isinstance(named, str) and named:
            return named
        arms = list(self.info.arm_identities)
        return arms[0] if len(arms) == 1 else DEFAULT_ARM

    @property
    def arms(self) -> list[str]:
        """The run's speculative arms: the switch's first, then the others by name."""
        first = self.switch_arm
        return [first, *sorted(set(self.info.arm_identities) - {first})]


@dataclass(frozen=True, slots=True)
class RetentionReport:
    """What one `apply_retention` did: pairs rolled up (each then deleted with its
    generations and scores), roll-up rows deleted for being past their own cut-off, and
    the rows that only raw pairs or that history kept: prompts no pair uses any more,
    finished runs without pairs that ended before the roll-up cut-off, switch audit rows
    older than it, and verdict revisions whose window ended before it."""

    rolled_up_pairs: int
    deleted_pairs: int
    deleted_rollups: int
    deleted_prompts: int = 0
    deleted_runs: int = 0
    deleted_audit_rows: int = 0
    deleted_revisions: int = 0


@dataclass(frozen=True, slots=True)
class History:
    """A time window of history read in one snapshot: the raw pairs still stored, and the
    roll-ups of the hours whose start lies in the window. A pair is in one or the other,
    never both (retention moves it in one transaction)."""

    pairs: list[PairFacts]
    rollups: list[PairRollup]


@dataclass(frozen=True, slots=True)
class StoredInterval:
    """One arm's production telemetry over one scrape interval, as stored: the interval,
    the arm, the arms key it was measured under (`canaryd.config.arms.arm_key`), and how
    many replicas were read at both ends, failed at the end, and restarted within it."""

    arm: str
    arms: str
    interval: TelemetryInterval
    replicas: int
    failed_replicas: int = 0
    restarted_replicas: int = 0


@dataclass(frozen=True, slots=True)
class TieMargin:
    """A tie margin calibrated on the deployment (`canaryd calibrate`): `margin` (nats)
    bounds the pair margin of `coverage` of the deployment's own greedy divergences with
    `confidence`, from `aa_divergent_pairs` divergent pairs of the baseline against
    `aa_arm` (itself, or the A/A control arm), one margin per pair; valid only under the
    arms key `arms` and on the engines `engines` (`canaryd.judging.calibration.
    engines_key`), for `gates.quality.tie_margin_max_age_days` after `calibrated_at`.
    For information: `divergences` divergent tokens measured, `aa` of them A/A and `ab`
    of the arm against the baseline (never part of the bound), `unmeasured` divergent
    pairs nothing measured, over `pairs` greedy pairs. Rows stored before the bound came
    from A/A pairs alone have no `aa_arm`, `aa_divergent_pairs` or `engines`, and no
    longer judge."""

    arms: str
    arm: str
    margin: float
    divergences: int
    aa: int
    ab: int
    unmeasured: int
    pairs: int
    coverage: float
    confidence: float
    calibrated_at: datetime
    aa_arm: str | None = None
    aa_divergent_pairs: int | None = None
    engines: str | None = None


class HistoryStore(Protocol):
    """Where pair records, runs and hourly roll-ups are kept."""

    def create_run(self, run: RunInfo) -> None: ...

    def finish_run(self, run_id: str, finished_at: datetime) -> None: ...

    def record_suite(self, name: str, sha256: str, path: str) -> None: ...

    def save_pair(self, record: PairRecord) -> None: ...

    def pairs(
        self,
        *,
        run_id: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        category: str | None = None,
        limit: int | None = None,
        arm: str | None = None,
    ) -> list[PairRecord]: ...

    def runs(self, limit: int | None = 20, *, kind: str | None = None) -> list[StoredRun]: ...

    def runs_by_id(self, run_ids: Collection[str]) -> dict[str, StoredRun]: ...

    def categories(self) -> list[str]: ...

    def apply_retention(
        self,
        now: datetime,
        raw_retention_days: float,
        rollup_retention_days: float,
        *,
        batch_pairs: int = RETENTION_BATCH_PAIRS,
    ) -> RetentionReport: ...

    def erase_live_text(self, before: datetime) -> int: ...

    def history(self, since: datetime, until: datetime) -> History: ...

    def pair_count(self, arm: str, since: datetime, until: datetime) -> int: ...

    def rollups(
        self, *, since: datetime | None = None, until: datetime | None = None
    ) -> list[PairRollup]: ...

    def serving(
        self, since: datetime, until: datetime, *, limit: int = SERVING_ROW_LIMIT
    ) -> list[ServingFacts]: ...

    def latest_pair_started_at(self) -> datetime | None: ...

    def latest_rollup_hour(self) -> datetime | None: ...

    def close(self) -> None: ...


class SwitchStore(Protocol):
    """The durable switch: its state under a lock, the audit trail, gate evaluations, the
    pinned drift references, and the evidence windows of revisions with their latched
    FAILs, operators' restores and confirmed traffic increases."""

    def switch(self) -> SwitchRecord: ...

    def change_switch(
        self,
        decide: Callable[[SwitchState, list[Evaluation]], SwitchOutcome],
        *,
        now: datetime,
        history: int,
        actor: str = "",
    ) -> SwitchOutcome: ...

    def record_actuation(
        self, generation: int, errors: Mapping[str, str], at: datetime
    ) -> bool: ...

    def record_gate_run(self, at: datetime) -> None: ...

    def audit(
        self, *, since: datetime | None = None, limit: int | None = None
    ) -> list[AuditEntry]: ...

    def save_evaluation(
        self, evaluation: Evaluation, *, comparison_arm: str | None = None
    ) -> None: ...

    def evaluations(self, limit: int, *, comparison_arm: str | None = None) -> list[Evaluation]: ...

    def latest_evaluation(self, *, comparison_arm: str | None = None) -> Evaluation | None: ...

    def prune_gate_decisions(self, before: datetime) -> int: ...

    def drift_references(self, arms: str) -> dict[str, ReferenceStats]: ...

    def pin_drift_references(
        self,
        references: Mapping[str, ReferenceStats],
        at: datetime,
        arms: str,
        *,
        replace: bool = False,
    ) -> None: ...

    def unpin_drift_references(self, categories: Collection[str] = ()) -> int: ...

    def revision_window(self, arm: str, revision: str) -> RevisionWindow | None: ...

    def start_revision(
        self, arm: str, revision: str, at: datetime, *, keep: int | None = None
    ) -> RevisionWindow: ...

    def current_revision(self, arm: str) -> RevisionWindow | None: ...

    def latch_revision(self, arm: str, revision: str, at: datetime, failure: str) -> bool: ...

    def restore_revisions(self, at: datetime, restore: str) -> list[RevisionWindow]: ...

    def mark_increase(self, arm: str, revision: str, at: datetime) -> None: ...

    def close(self) -> None: ...


class TelemetryStore(Protocol):
    """The arms' production telemetry, one row per arm and scrape interval."""

    def save_telemetry(self, intervals: Sequence[StoredInterval]) -> None: ...

    def telemetry(
        self,
        arm: str,
        *,
        arms: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[StoredInterval]: ...

    def prune_telemetry(self, before: datetime) -> int: ...


class CalibrationStore(Protocol):
    """The calibrated tie margin of each arms key (one per key, the latest)."""

    def tie_margin(self, arms: str) -> TieMargin | None: ...

    def save_tie_margin(self, margin: TieMargin) -> None: ...


class Store(HistoryStore, SwitchStore, TelemetryStore, CalibrationStore, Protocol):
    """Everything canaryd keeps: history, the switch, telemetry and calibrations.
    `SqlStore` implements it."""

    @property
    def url(self) -> str: ...
