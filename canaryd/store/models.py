"""The SQL schema of canaryd's history, as SQLAlchemy 2 typed declarative models.

These models describe the schema that `alembic/versions` creates; they are not the source
of truth for it (every change is a migration, and the migration test compares the two).
Rows are flat on purpose: a `PairRecord` becomes one `pairs` row (named by its
speculative arm), two `generations` rows (baseline and speculative) and at most one
`pair_scores` row, so time-window queries by category and arm are plain indexed range
scans; a prompt sent to several speculative arms is a row per arm, sharing `group_id`
(and a copy of the baseline generation). A figure an engine did not report is SQL NULL, never 0.
The switch's five tables are declared in Core (`canaryd.store.switching_tables`, where the
kill switch queries them without the ORM) and mapped here onto the same `metadata`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Double,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from canaryd.store.model_types import NAMING_CONVENTION, UTCDateTime, json_column_type, metadata

# Importing the module declares all five switch tables on `metadata` (Alembic sees them);
# the two the switch alone queries (gate_decisions, drift_references) need no ORM class.
from canaryd.store.switching_tables import revisions, switch_audit, switch_state

__all__ = [
    "NAMING_CONVENTION",
    "Base",
    "GenerationRow",
    "PairRollupRow",
    "PairRow",
    "PairScoresRow",
    "PromptRow",
    "RevisionRow",
    "RunRow",
    "SuiteRow",
    "SwitchAuditRow",
    "SwitchStateRow",
    "TelemetryIntervalRow",
    "TieMarginRow",
    "UTCDateTime",
    "json_column_type",
]


class Base(DeclarativeBase):
    metadata = metadata


# The switch's tables are declared in Core (`canaryd.store.switching_tables`), where the
# kill switch queries them; these classes map three of them for the history's queries
# (retention) and the tests.
class SwitchStateRow(Base):
    """The rollback switch's one row (see `switching_tables.switch_state`)."""

    __table__ = switch_state

    id: Mapped[int]
    mode: Mapped[str]
    control: Mapped[str]
    generation: Mapped[int]
    since: Mapped[datetime | None]
    actor: Mapped[str]
    reason: Mapped[str]
    latched: Mapped[bool]
    cooldown_until: Mapped[datetime | None]
    recent_trips: Mapped[list[str]]
    categories: Mapped[dict[str, Any]]
    applied_generation: Mapped[int | None]
    actuator_errors: Mapped[dict[str, str] | None]
    actuated_at: Mapped[datetime | None]
    gates_completed_at: Mapped[datetime | None]


class SwitchAuditRow(Base):
    """A switch transition or a refused command (see `switching_tables.switch_audit`)."""

    __table__ = switch_audit

    id: Mapped[int]
    at: Mapped[datetime]
    kind: Mapped[str]
    generation: Mapped[int]
    previous: Mapped[str]
    target: Mapped[str]
    control: Mapped[str]
    actor: Mapped[str]
    reason: Mapped[str]
    evidence: Mapped[list[dict[str, Any]]]
    category: Mapped[str | None]


class RevisionRow(Base):
    """A revision's evidence window start (see `switching_tables.revisions`)."""

    __table__ = revisions

    arm: Mapped[str]
    revision: Mapped[str]
    started_at: Mapped[datetime]
    failed_at: Mapped[datetime | None]
    failure: Mapped[str | None]
    restored_at: Mapped[datetime | None]
    restore: Mapped[str | None]
    increased_at: Mapped[datetime | None]


class SuiteRow(Base):
    """One version of a prompt suite file, identified by its sha256."""

    __tablename__ = "suites"
    __table_args__ = (UniqueConstraint("name", "sha256"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    sha256: Mapped[str] = mapped_column(String(64))
    path: Mapped[str] = mapped_column(Text)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime())


class PromptRow(Base):
    """One prompt as it was run; an edited prompt has a new content hash and a new row."""

    __tablename__ = "prompts"
    __table_args__ = (Index(None, "suite", "prompt_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    content_hash: Mapped[str] = mapped_column(String(64), unique=True)
    suite: Mapped[str] = mapped_column(String(200))
    prompt_id: Mapped[str] = mapped_column(String(200))
    category: Mapped[str] = mapped_column(String(100))
    messages: Mapped[list[dict[str, str]]] = mapped_column(json_column_type())
    max_tokens: Mapped[int] = mapped_column(Integer)
    reference: Mapped[str | None] = mapped_column(Text)
    answer_check: Mapped[dict[str, Any] | None] = mapped_column(json_column_type())
    source: Mapped[str] = mapped_column(Text)  # where the content was first seen


class RunRow(Base):
    """One `canaryd once`, daemon lifetime, bench or `canaryd judge`, with the
    configuration it ran."""

    __tablename__ = "runs"

    run_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    config: Mapped[dict[str, Any]] = mapped_column(json_column_type())
    config_hash: Mapped[str] = mapped_column(String(64))
    baseline_identity: Mapped[dict[str, str]] = mapped_column(json_column_type())
    speculative_identity: Mapped[dict[str, str]] = mapped_column(json_column_type())
    software: Mapped[dict[str, str]] = mapped_column(json_column_type())
    # Every speculative arm's identity by arm name; {} in runs from before arms had names.
    arm_identities: Mapped[dict[str, dict[str, str]]] = mapped_column(
        json_column_type(), server_default="{}"
    )


class PairRow(Base):
    """One prompt run on the baseline and the speculative arm `arm`; `category` is copied
    from the prompt for window scans. The rows of one prompt sent to several speculative
    arms share `group_id` (a single arm's row: its own `pair_id`)."""

    __tablename__ = "pairs"
    __table_args__ = (
        Index(None, "category", "started_at"),
        Index(None, "run_id", "started_at"),
        Index(None, "arm", "started_at"),
        Index(None, "source", "started_at"),
    )

    pair_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.run_id"))
    prompt_ref: Mapped[int] = mapped_column(ForeignKey("prompts.id"), index=True)
    category: Mapped[str] = mapped_column(String(100))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    arm_order: Mapped[list[str]] = mapped_column(json_column_type())
    seed: Mapped[int] = mapped_column(BigInteger)
    temperature: Mapped[float] = mapped_column(Double)
    complete: Mapped[bool] = mapped_column(Boolean)
    arm: Mapped[str] = mapped_column(String(32), server_default="speculative")
    group_id: Mapped[str] = mapped_column(String(64), server_default="")
    # `control` (a suite prompt) or `live` (a mirrored production request).
    source: Mapped[str] = mapped_column(String(16), server_default="control")

    prompt: Mapped[PromptRow] = relationship(lazy="joined", innerjoin=True)
    generations: Mapped[list[GenerationRow]] = relationship(
        back_populates="pair", lazy="selectin", cascade="all, delete-orphan"
    )
    scores: Mapped[PairScoresRow | None] = relationship(
        back_populates="pair", lazy="joined", cascade="all, delete-orphan"
    )


class GenerationRow(Base):
    """One arm's generation in a pair: every field of `GenerationResult`."""

    __tablename__ = "generations"
    __table_args__ = (
        CheckConstraint("arm IN ('baseline', 'speculative')", name="arm"),
        CheckConstraint("prompt_tokens >= 0 AND output_tokens >= 0", name="token_counts"),
        CheckConstraint("e2e_s >= 0", name="e2e_s"),
        CheckConstraint(
            "verify_steps >= 0 AND draft_tokens >= 0 AND accepted_tokens >= 0",
            name="acceptance_counts",
        ),
        Index(None, "arm", "pair_id"),
    )

    pair_id: Mapped[str] = mapped_column(
        ForeignKey("pairs.pair_id", ondelete="CASCADE"), primary_key=True
    )
    arm: Mapped[str] = mapped_column(String(16), primary_key=True)
    text: Mapped[str] = mapped_column(Text)
    token_ids: Mapped[list[int]] = mapped_column(json_column_type())
    finish_reason: Mapped[str] = mapped_column(String(32))
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    output_tokens: Mapped[int] = mapped_column(Integer)
    ttft_s: Mapped[float | None] = mapped_column(Double)
    tpot_s: Mapped[float | None] = mapped_column(Double)
    e2e_s: Mapped[float] = mapped_column(Double)
    error: Mapped[str] = mapped_column(String(16))
    error_detail: Mapped[str] = mapped_column(Text)
    http_status: Mapped[int | None] = mapped_column(Integer)
    acceptance_source: Mapped[str] = mapped_column(String(32))
    # All NULL when the engine reported no SpeculativeStats (baseline arm, or not reported).
    speculative_source: Mapped[str | None] = mapped_column(String(32))
    verify_steps: Mapped[int | None] = mapped_column(Integer)
    draft_tokens: Mapped[int | None] = mapped_column(Integer)
    accepted_tokens: Mapped[int | None] = mapped_column(Integer)
    accepted_per_position: Mapped[list[int] | None] = mapped_column(json_column_type())
    drafted_per_position: Mapped[list[int] | None] = mapped_column(json_column_type())
    # All NULL when the engine did not time its own drafting (`DraftCost`).
    draft_s: Mapped[float | None] = mapped_column(Double)
    verify_s: Mapped[float | None] = mapped_column(Double)
    tree_tokens: Mapped[int | None] = mapped_column(Integer)
    # All NULL when the generation has no `InterTokenLatency` (fewer than two tokens).
    itl_tokens: Mapped[int | None] = mapped_column(Integer)
    itl_chunks: Mapped[int | None] = mapped_column(Integer)
    itl_p50_s: Mapped[float | None] = mapped_column(Double)
    itl_p95_s: Mapped[float | None] = mapped_column(Double)
    itl_p99_s: Mapped[float | None] = mapped_column(Double)
    itl_max_s: Mapped[float | None] = mapped_column(Double)

    pair: Mapped[PairRow] = relationship(back_populates="generations")


class PairScoresRow(Base):
    """`PairScores` of a complete pair; absent when either arm failed."""

    __tablename__ = "pair_scores"

    pair_id: Mapped[str] = mapped_column(
        ForeignKey("pairs.pair_id", ondelete="CASCADE"), primary_key=True
    )
    exact_match: Mapped[bool] = mapped_column(Boolean)
    first_divergence: Mapped[int | None] = mapped_column(Integer)
    token_edit_similarity: Mapped[float] = mapped_column(Double)
    rouge_l: Mapped[float] = mapped_column(Double)
    chrf: Mapped[float] = mapped_column(Double)
    length_ratio: Mapped[float | None] = mapped_column(Double)
    baseline_loop: Mapped[bool] = mapped_column(Boolean)
    speculative_loop: Mapped[bool] = mapped_column(Boolean)
    baseline_task_score: Mapped[float | None] = mapped_column(Double)
    speculative_task_score: Mapped[float | None] = mapped_column(Double)
    task_score_delta: Mapped[float | None] = mapped_column(Double)
    nll_delta: Mapped[float | None] = mapped_column(Double)
    argmax_delta: Mapped[float | None] = mapped_column(Double)
    divergence_margin: Mapped[float | None] = mapped_column(Double)
    baseline_max_nll: Mapped[float | None] = mapped_column(Double)
    speculative_max_nll: Mapped[float | None] = mapped_column(Double)
    divergence_judge: Mapped[str | None] = mapped_column(String(16))

    pair: Mapped[PairRow] = relationship(back_populates="scores")


class PairRollupRow(Base):
    """The pairs of one category and speculative arm in one UTC hour, rolled up by
    retention (see
    `canaryd.store.rollup.PairRollup`, which this row stores field for field).

    Histograms are JSON lists of counts over the bucket bounds in `canaryd.store.rollup`;
    errors are a JSON object of counts by error kind.
    """

    __tablename__ = "pair_rollups"
    __table_args__ = (
        UniqueConstraint("hour_start", "category", "arm"),
        CheckConstraint("complete_pairs >= 0 AND complete_pairs <= pairs", name="pair_counts"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    hour_start: Mapped[datetime] = mapped_column(UTCDateTime())
    category: Mapped[str] = mapped_column(String(100))
    arm: Mapped[str] = mapped_column(String(32), server_default="speculative")
    pairs: Mapped[int] = mapped_column(Integer)
    complete_pairs: Mapped[int] = mapped_column(Integer)
    scored_pairs: Mapped[int] = mapped_column(Integer)
    exact_matches: Mapped[int] = mapped_column(Integer)
    quality_delta_count: Mapped[int] = mapped_column(Integer)
    quality_delta_sum: Mapped[float] = mapped_column(Double)
    speedup_count: Mapped[int] = mapped_column(Integer)
    speedup_sum: Mapped[float] = mapped_column(Double)
    speedup_histogram: Mapped[list[int]] = mapped_column(json_column_type())
    baseline_ok: Mapped[int] = mapped_column(Integer)
    baseline_errors: Mapped[dict[str, int]] = mapped_column(json_column_type())
    baseline_output_tokens: Mapped[int] = mapped_column(BigInteger)
    baseline_e2e_sum_s: Mapped[float] = mapped_column(Double)
    baseline_e2e_histogram: Mapped[list[int]] = mapped_column(json_column_type())
    baseline_ttft_count: Mapped[int] = mapped_column(Integer)
    baseline_ttft_sum_s: Mapped[float] = mapped_column(Double)
    baseline_ttft_histogram: Mapped[list[int]] = mapped_column(json_column_type())
    baseline_tpot_count: Mapped[int] = mapped_column(Integer)
    baseline_tpot_sum_s: Mapped[float] = mapped_column(Double)
    baseline_tpot_histogram: Mapped[list[int]] = mapped_column(json_column_type())
    speculative_ok: Mapped[int] = mapped_column(Integer)
    speculative_errors: Mapped[dict[str, int]] = mapped_column(json_column_type())
    speculative_output_tokens: Mapped[int] = mapped_column(BigInteger)
    speculative_e2e_sum_s: Mapped[float] = mapped_column(Double)
    speculative_e2e_histogram: Mapped[list[int]] = mapped_column(json_column_type())
    speculative_ttft_count: Mapped[int] = mapped_column(Integer)
    speculative_ttft_sum_s: Mapped[float] = mapped_column(Double)
    speculative_ttft_histogram: Mapped[list[int]] = mapped_column(json_column_type())
    speculative_tpot_count: Mapped[int] = mapped_column(Integer)
    speculative_tpot_sum_s: Mapped[float] = mapped_column(Double)
    speculative_tpot_histogram: Mapped[list[int]] = mapped_column(json_column_type())
    speculative_reported: Mapped[int] = mapped_column(Integer)
    verify_steps: Mapped[int] = mapped_column(BigInteger)
    draft_tokens: Mapped[int] = mapped_column(BigInteger)
    accepted_tokens: Mapped[int] = mapped_column(BigInteger)
    accepted_per_position: Mapped[list[int]] = mapped_column(json_column_type())
    drafted_per_position: Mapped[list[int]] = mapped_column(json_column_type())
    acceptance_length_count: Mapped[int] = mapped_column(Integer)
    acceptance_length_sum: Mapped[float] = mapped_column(Double)
    acceptance_length_histogram: Mapped[list[int]] = mapped_column(json_column_type())


class TelemetryIntervalRow(Base):
    """One arm's production telemetry over one scrape interval (`start_at`, `end_at`]: a
    `gates.telemetry.intervals.TelemetryInterval` field for field, its latency histograms as JSON
    (`{"le": [upper bounds, the last null for +inf], "count": [cumulative counts]}`).
    `arms` is the arms key (`canaryd.config.arms.arm_key`) the arm was configured under, so
    that evidence measured under another configuration is not read as this one's."""

    __tablename__ = "telemetry_intervals"
    __table_args__ = (
        Index(None, "arm", "end_at"),
        CheckConstraint("end_at > start_at", name="interval"),
        CheckConstraint("replicas >= 0 AND failed_replicas >= 0", name="replicas"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    arm: Mapped[str] = mapped_column(String(32))
    arms: Mapped[str] = mapped_column(String(64))
    start_at: Mapped[datetime] = mapped_column(UTCDateTime())
    end_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    replicas: Mapped[int] = mapped_column(Integer)
    failed_replicas: Mapped[int] = mapped_column(Integer)
    restarted_replicas: Mapped[int] = mapped_column(Integer)
    requests: Mapped[int | None] = mapped_column(BigInteger)
    errors: Mapped[int | None] = mapped_column(BigInteger)
    client_errors: Mapped[int | None] = mapped_column(BigInteger)
    drafts: Mapped[int | None] = mapped_column(BigInteger)
    draft_tokens: Mapped[int | None] = mapped_column(BigInteger)
    accepted_tokens: Mapped[int | None] = mapped_column(BigInteger)
    running: Mapped[float | None] = mapped_column(Double)
    waiting: Mapped[float | None] = mapped_column(Double)
    reported_acceptance_length: Mapped[float | None] = mapped_column(Double)
    reported_acceptance_rate: Mapped[float | None] = mapped_column(Double)
    e2e: Mapped[dict[str, Any] | None] = mapped_column(json_column_type())
    ttft: Mapped[dict[str, Any] | None] = mapped_column(json_column_type())
    itl: Mapped[dict[str, Any] | None] = mapped_column(json_column_type())


class TieMarginRow(Base):
    """The tie margin calibrated under one arms key (`canaryd.store.abc.TieMargin`, field
    for field): the latest calibration replaces the one before."""

    __tablename__ = "tie_margins"
    __table_args__ = (CheckConstraint("margin >= 0", name="margin"),)

    arms: Mapped[str] = mapped_column(String(64), primary_key=True)
    arm: Mapped[str] = mapped_column(String(32))
    margin: Mapped[float] = mapped_column(Double)
    divergences: Mapped[int] = mapped_column(Integer)
    aa: Mapped[int] = mapped_column(Integer)
    ab: Mapped[int] = mapped_column(Integer)
    unmeasured: Mapped[int] = mapped_column(Integer)
    pairs: Mapped[int] = mapped_column(Integer)
    coverage: Mapped[float] = mapped_column(Double)
    confidence: Mapped[float] = mapped_column(Double)
    calibrated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # None on rows from before the bound came from A/A pairs alone (migration 0021).
    aa_arm: Mapped[str | None] = mapped_column(String(32))
    aa_divergent_pairs: Mapped[int | None] = mapped_column(Integer)
    engines: Mapped[str | None] = mapped_column(String(64))
