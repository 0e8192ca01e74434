"""Initial schema: suites, prompts, runs, pairs, generations, pair_scores.

Revision ID: 0001
Revises:
Create Date: 2025-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _json() -> sa.types.TypeEngine:
    # Frozen copy of canaryd.store.models.json_column_type: migrations must not change
    # when the models do.
    return sa.JSON(none_as_null=True).with_variant(
        postgresql.JSONB(none_as_null=True), "postgresql"
    )


def upgrade() -> None:
    op.create_table(
        "suites",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_suites"),
        sa.UniqueConstraint("name", "sha256", name="uq_suites_name_sha256"),
    )
    op.create_table(
        "prompts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("suite", sa.String(200), nullable=False),
        sa.Column("prompt_id", sa.String(200), nullable=False),
        sa.Column("category", sa.String(100), nullable=False),
        sa.Column("messages", _json(), nullable=False),
        sa.Column("max_tokens", sa.Integer(), nullable=False),
        sa.Column("reference", sa.Text(), nullable=True),
        sa.Column("answer_check", _json(), nullable=True),
        sa.Column("source", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_prompts"),
        sa.UniqueConstraint("content_hash", name="uq_prompts_content_hash"),
    )
    op.create_index("ix_prompts_suite_prompt_id", "prompts", ["suite", "prompt_id"])
    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("config", _json(), nullable=False),
        sa.Column("config_hash", sa.String(64), nullable=False),
        sa.Column("baseline_identity", _json(), nullable=False),
        sa.Column("speculative_identity", _json(), nullable=False),
        sa.Column("software", _json(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", name="pk_runs"),
    )
    op.create_index("ix_runs_started_at", "runs", ["started_at"])
    op.create_table(
        "pairs",
        sa.Column("pair_id", sa.String(64), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("prompt_ref", sa.Integer(), nullable=False),
        sa.Column("category", sa.String(100), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("arm_order", _json(), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("temperature", sa.Double(), nullable=False),
        sa.Column("complete", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"], name="fk_pairs_run_id_runs"),
        sa.ForeignKeyConstraint(
            ["prompt_ref"], ["prompts.id"], name="fk_pairs_prompt_ref_prompts"
        ),
        sa.PrimaryKeyConstraint("pair_id", name="pk_pairs"),
    )
    op.create_index("ix_pairs_started_at", "pairs", ["started_at"])
    op.create_index("ix_pairs_category_started_at", "pairs", ["category", "started_at"])
    op.create_index("ix_pairs_run_id_started_at", "pairs", ["run_id", "started_at"])
    op.create_index("ix_pairs_prompt_ref", "pairs", ["prompt_ref"])
    op.create_table(
        "generations",
        sa.Column("pair_id", sa.String(64), nullable=False),
        sa.Column("arm", sa.String(16), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("token_ids", _json(), nullable=False),
        sa.Column("finish_reason", sa.String(32), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("ttft_s", sa.Double(), nullable=True),
        sa.Column("tpot_s", sa.Double(), nullable=True),
        sa.Column("e2e_s", sa.Double(), nullable=False),
        sa.Column("error", sa.String(16), nullable=False),
        sa.Column("error_detail", sa.Text(), nullable=False),
        sa.Column("http_status", sa.Integer(), nullable=True),
        sa.Column("acceptance_source", sa.String(32), nullable=False),
        sa.Column("speculative_source", sa.String(32), nullable=True),
        sa.Column("verify_steps", sa.Integer(), nullable=True),
        sa.Column("draft_tokens", sa.Integer(), nullable=True),
        sa.Column("accepted_tokens", sa.Integer(), nullable=True),
        sa.Column("accepted_per_position", _json(), nullable=True),
        sa.Column("drafted_per_position", _json(), nullable=True),
        sa.CheckConstraint("arm IN ('baseline', 'speculative')", name="ck_generations_arm"),
        sa.CheckConstraint(
            "prompt_tokens >= 0 AND output_tokens >= 0", name="ck_generations_token_counts"
        ),
        sa.CheckConstraint("e2e_s >= 0", name="ck_generations_e2e_s"),
        sa.CheckConstraint(
            "verify_steps >= 0 AND draft_tokens >= 0 AND accepted_tokens >= 0",
            name="ck_generations_acceptance_counts",
        ),
        sa.ForeignKeyConstraint(
            ["pair_id"], ["pairs.pair_id"], name="fk_generations_pair_id_pairs",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("pair_id", "arm", name="pk_generations"),
    )
    op.create_index("ix_generations_arm_pair_id", "generations", ["arm", "pair_id"])
    op.create_table(
        "pair_scores",
        sa.Column("pair_id", sa.String(64), nullable=False),
        sa.Column("exact_match", sa.Boolean(), nullable=False),
        sa.Column("first_divergence", sa.Integer(), nullable=True),
        sa.Column("token_edit_similarity", sa.Double(), nullable=False),
        sa.Column("rouge_l", sa.Double(), nullable=False),
        sa.Column("chrf", sa.Double(), nullable=False),
        sa.Column("length_ratio", sa.Double(), nullable=True),
        sa.Column("baseline_loop", sa.Boolean(), nullable=False),
        sa.Column("speculative_loop", sa.Boolean(), nullable=False),
        sa.Column("baseline_task_score", sa.Double(), nullable=True),
        sa.Column("speculative_task_score", sa.Double(), nullable=True),
        sa.Column("task_score_delta", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(
            ["pair_id"], ["pairs.pair_id"], name="fk_pair_scores_pair_id_pairs",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("pair_id", name="pk_pair_scores"),
    )


def downgrade() -> None:
    op.drop_table("pair_scores")
    op.drop_index("ix_generations_arm_pair_id", table_name="generations")
    op.drop_table("generations")
    for index in ("ix_pairs_prompt_ref", "ix_pairs_run_id_started_at",
                  "ix_pairs_category_started_at", "ix_pairs_started_at"):
        op.drop_index(index, table_name="pairs")
    op.drop_table("pairs")
    op.drop_index("ix_runs_started_at", table_name="runs")
    op.drop_table("runs")
    op.drop_index("ix_prompts_suite_prompt_id", table_name="prompts")
    op.drop_table("prompts")
    op.drop_table("suites")
