"""Record builders and an open store for the store tests.

The builders are offered as fixtures (`pair`, `failed`, `run_info`, `prompt`) so that test
modules need no imports from this file; the mapping tests import `unset_columns`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import inspect

from canaryd.store import SqlStore
from canaryd.store.models import Base
from engine.timing import inter_token_latency
from engine.types import (
    AcceptanceSource,
    ErrorKind,
    GenerationResult,
    Message,
    SpeculativeStats,
)
from gates.records import Check, PairRecord, PairScores, Prompt, RunInfo

T0 = datetime(2025, 11, 29, 12, 0, 0, 123456, tzinfo=UTC)

PairFactory = Callable[..., PairRecord]


def unset_columns(row: Base) -> set[str]:
    """Columns of `row` the mapping left unset (the database would store its default)."""
    columns = {attribute.key for attribute in inspect(type(row)).column_attrs}
    return columns - set(vars(row))


def build_run(run_id: str = "run-1", started_at: datetime = T0) -> RunInfo:
    return RunInfo(
        run_id=run_id,
        kind="once",
        started_at=started_at,
        config={"pairs": 12, "engines": {"baseline": {"kind": "hf"}}, "ratio": 0.25},
        config_hash="c" * 64,
        baseline_identity={"model": "SmolLM2-135M-Instruct", "engine": "hf"},
        speculative_identity={"model": "SmolLM2-135M-Instruct", "drafter": "prompt_lookup"},
        software={"canaryd": "0.1.0", "torch": "2.13.0"},
    )


def build_prompt(**changes: Any) -> Prompt:
    prompt = Prompt(
        id="sum-001",
        category="summarisation",
        messages=(
            Message(role="system", content="Be brief."),
            Message(role="user", content="Summarise: 速度 and accuracy."),
        ),
        max_tokens=96,
        reference="A short summary.",
        check=Check(kind="numeric", value=42.5, tolerance=0.01),
        suite="default",
        source="prompts/summarisation.jsonl:1",
    )
    return replace(prompt, **changes)


def baseline_result() -> GenerationResult:
    return GenerationResult(
        text="Speed and accuracy.",
        token_ids=(101, 202, 303, 2),
        finish_reason="stop",
        prompt_tokens=17,
        output_tokens=4,
        ttft_s=0.0123456789,
        tpot_s=0.0371,
        e2e_s=0.1234567890123,
    )


def speculative_result() -> GenerationResult:
    return GenerationResult(
        text="Speed and accuracy.",
        token_ids=(101, 202, 303, 2),
        finish_reason="stop",
        prompt_tokens=17,
        output_tokens=4,
        ttft_s=0.011,
        tpot_s=0.02,
        e2e_s=0.061,
        speculative=SpeculativeStats(
            verify_steps=2,
            draft_tokens=8,
            accepted_tokens=2,
            accepted_per_position=(1, 1, 0, 0),
            drafted_per_position=(2, 2, 2, 2),
            source=AcceptanceSource.DECODING_LOOP,
        ),
        acceptance_source=AcceptanceSource.DECODING_LOOP,
        itl=inter_token_latency([(0.011, 2), (0.036, 1), (0.061, 1)]),
    )


def scores() -> PairScores:
    return PairScores(
        exact_match=True,
        first_divergence=None,
        token_edit_similarity=1.0,
        rouge_l=1.0,
        chrf=100.0,
        length_ratio=1.0,
        baseline_loop=False,
        speculative_loop=False,
        baseline_task_score=None,
        speculative_task_score=0.5,
        task_score_delta=None,
    )


_pair_ids = itertools.count(1)


def build_pair(
    *,
    run_id: str = "run-1",
    started_at: datetime = T0,
    category: str = "summarisation",
    **changes: Any,
) -> PairRecord:
    record = PairRecord(
        pair_id=f"pair-{next(_pair_ids):05d}",
        run_id=run_id,
        prompt=build_prompt(category=category),
        started_at=started_at,
        arm_order=("speculative", "baseline"),
        baseline=baseline_result(),
        speculative=speculative_result(),
        scores=scores(),
        sampling_seed=2**40 + 7,
        temperature=0.0,
    )
    return replace(record, **changes)


def build_failed_pair(**changes: Any) -> PairRecord:
    """The speculative arm got an HTTP 503 and reported nothing; no scores."""
    failed = GenerationResult.failed(
        ErrorKind.HTTP,
        "503 Service Unavailable: overloaded",
        e2e_s=1.5,
        prompt_tokens=17,
        http_status=503,
    )
    return build_pair(speculative=failed, scores=None, **changes)


@pytest.fixture
def pair() -> PairFactory:
    """Build a complete pair with speculative stats; keyword arguments replace fields."""
    return build_pair


@pytest.fixture
def failed() -> PairFactory:
    """Build a pair whose speculative arm failed with HTTP 503 and has no scores."""
    return build_failed_pair


@pytest.fixture
def run_info() -> Callable[..., RunInfo]:
    return build_run


@pytest.fixture
def prompt() -> Callable[..., Prompt]:
    return build_prompt


@pytest.fixture
def store(database_url: str) -> Iterator[SqlStore]:
    """An open store on a fresh database, migrated to head, with run 'run-1' created."""
    with SqlStore.open(database_url, create=True) as opened:
        opened.create_run(build_run())
        yield opened
