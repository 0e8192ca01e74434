"""The history's record <-> row mapping: every column is written, and pairs, prompts and
runs come back unchanged.

Most fields are mapped by name, so a field renamed or added on one side only would be
silently dropped; these tests catch that without a database.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import inspect

from canaryd.store.mapping import (
    pair_from_row,
    pair_row,
    prompt_values,
    run_from_row,
    run_row,
)
from canaryd.store.models import GenerationRow, PromptRow
from gates.records import PairRecord, RunInfo
from tests.canaryd.store.conftest import unset_columns


def test_a_pair_sets_every_column_of_its_rows(pair: Any) -> None:
    record: PairRecord = pair()
    row = pair_row(record, prompt_ref=7)
    assert unset_columns(row) == set()
    assert row.scores is not None
    assert unset_columns(row.scores) == {"pair_id"}  # set from the pair on flush
    for generation in row.generations:
        assert unset_columns(generation) == {"pair_id"}
    assert set(prompt_values(record.prompt)) == {
        attribute.key for attribute in inspect(PromptRow).column_attrs
    } - {"id"}


def test_a_pair_comes_back_unchanged(pair: Any, failed: Any) -> None:
    for record in (pair(), failed()):
        row = pair_row(record, prompt_ref=7)
        row.prompt = PromptRow(**prompt_values(record.prompt))
        assert pair_from_row(row) == record


def test_an_unreported_speculative_arm_stores_null_not_zero(failed: Any) -> None:
    row = pair_row(failed(), prompt_ref=7)
    speculative = next(g for g in row.generations if g.arm == "speculative")
    assert isinstance(speculative, GenerationRow)
    assert speculative.verify_steps is None and speculative.speculative_source is None
    assert speculative.accepted_per_position is None


def test_itl_is_stored_as_its_summary(pair: Any) -> None:
    """A generation's ITL comes back as its quantiles and counts (not its arrivals); a
    generation without one stores NULL."""
    record: PairRecord = pair()
    row = pair_row(record, prompt_ref=7)
    row.prompt = PromptRow(**prompt_values(record.prompt))
    by_arm = {generation.arm: generation for generation in row.generations}
    assert by_arm["baseline"].itl_p99_s is None and by_arm["baseline"].itl_tokens is None
    itl = pair_from_row(row).speculative.itl
    assert itl is not None and itl == record.speculative.itl
    assert (itl.tokens, itl.chunks, itl.arrivals) == (3, 2, ())
    assert itl.max_s == by_arm["speculative"].itl_max_s


def test_a_run_comes_back_unchanged(run_info: Any) -> None:
    info: RunInfo = run_info()
    row = run_row(info)
    assert unset_columns(row) == set()
    stored = run_from_row(row)
    assert stored.info == info and stored.finished_at is None
