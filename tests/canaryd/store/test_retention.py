"""Retention: old raw pairs rolled up into per-hour roll-ups, then deleted; old roll-ups pruned."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from canaryd.store import RetentionReport, SqlStore
from canaryd.store.models import (
    GenerationRow,
    PairRow,
    PairScoresRow,
    PromptRow,
    SwitchAuditRow,
)
from canaryd.store.rollup import (
    ArmRollup,
    PairRollup,
    facts_from_record,
    merge_rollups,
    rollup_of,
)
from engine.types import ErrorKind, GenerationResult
from gates.records import PairRecord, RunInfo

NOW = datetime(2025, 12, 20, 15, 30, tzinfo=UTC)
OLD = datetime(2025, 12, 10, 9, 5, tzinfo=UTC)  # 10 days before NOW, in hour 09:00
OLD_HOUR = datetime(2025, 12, 10, 9, 0, tzinfo=UTC)


def row_count(store: SqlStore, model: type[Any]) -> int:
    with SqlStore.open(store_url(store)) as fresh, fresh._sessions() as session:
        return int(session.scalar(select(func.count()).select_from(model)) or 0)


def store_url(store: SqlStore) -> str:
    return store._url.render_as_string(hide_password=False)


def assert_same_rollup(actual: Any, expected: Any, path: str = "rollup") -> None:
    """Field by field; float sums compared approximately (addition order differs)."""
    if dataclasses.is_dataclass(expected):
        for spec in dataclasses.fields(expected):
            assert_same_rollup(
                getattr(actual, spec.name), getattr(expected, spec.name), f"{path}.{spec.name}"
            )
    elif isinstance(expected, float):
        assert actual == pytest.approx(expected, rel=1e-12, abs=1e-12), path
    else:
        assert actual == expected, path


def total(rollups: Iterable[PairRollup]) -> PairRollup:
    return merge_rollups(*rollups, hour=OLD_HOUR, category="all")


def slow(result: GenerationResult, e2e_s: float) -> GenerationResult:
    return dataclasses.replace(result, e2e_s=e2e_s)


class TestApplyRetention:
    def test_rolls_up_exactly_the_old_pairs_and_deletes_them(
        self, store: SqlStore, pair: Any
    ) -> None:
        """Pairs older than the raw cut-off become roll-ups and vanish with their rows; newer
        pairs stay untouched."""
        old = [
            pair(started_at=OLD),
            pair(started_at=OLD + timedelta(minutes=20)),
            pair(started_at=OLD, category="code"),
        ]
        recent = [pair(started_at=NOW - timedelta(days=6, hours=23))]
        for record in [*old, *recent]:
            store.save_pair(record)

        report = store.apply_retention(NOW, raw_retention_days=7, rollup_retention_days=90)

        # The "code" prompt was used by a rolled-up pair only; the other one is still used.
        assert report == RetentionReport(
            rolled_up_pairs=3, deleted_pairs=3, deleted_rollups=0, deleted_prompts=1
        )
        assert store.pairs() == recent
        assert row_count(store, GenerationRow) == 2
        assert row_count(store, PairScoresRow) == 1
        by_key = {(r.hour_start, r.category): r for r in store.rollups()}
        assert set(by_key) == {(OLD_HOUR, "code"), (OLD_HOUR, "summarisation")}
        assert_same_rollup(
            by_key[OLD_HOUR, "summarisation"],
            rollup_of([facts_from_record(r) for r in old[:2]], OLD_HOUR, "summarisation"),
        )
        assert by_key[OLD_HOUR, "code"].pairs == 1

    def test_pair_exactly_at_the_cut_off_is_kept(self, store: SqlStore, pair: Any) -> None:
        """The cut-off is exclusive: a pair started exactly raw_retention_days ago stays raw."""
        store.save_pair(pair(started_at=NOW - timedelta(days=7)))
        report = store.apply_retention(NOW, raw_retention_days=7, rollup_retention_days=90)
        assert report.rolled_up_pairs == 0
        assert len(store.pairs()) == 1

    def test_rerunning_is_idempotent(self, store: SqlStore, pair: Any, failed: Any) -> None:
        """A second retention at the same time rolls up nothing and leaves roll-ups unchanged."""
        store.save_pair(pair(started_at=OLD))
        store.save_pair(failed(started_at=OLD + timedelta(minutes=1)))
        store.apply_retention(NOW, raw_retention_days=7, rollup_retention_days=90)
        before = store.rollups()

        again = store.apply_retention(NOW, raw_retention_days=7, rollup_retention_days=90)

        assert again == RetentionReport(rolled_up_pairs=0, deleted_pairs=0, deleted_rollups=0)
        assert store.rollups() == before

    def test_later_pairs_merge_into_an_existing_hour(self, store: SqlStore, pair: Any) -> None:
        """Pairs of an hour already rolled up are added to that hour's row, not a new one."""
        first = [pair(started_at=OLD), pair(started_at=OLD + timedelta(minutes=10))]
        late = pair(
            started_at=OLD + timedelta(minutes=50),
            baseline=slow(pair().baseline, 2.5),
        )
        for record in first:
            store.save_pair(record)
        store.apply_retention(NOW, raw_retention_days=7, rollup_retention_days=90)
        store.save_pair(late)  # e.g. a backfill, or a clock that was behind

        report = store.apply_retention(NOW, raw_retention_days=7, rollup_retention_days=90)

        assert report.rolled_up_pairs == 1
        (stored,) = store.rollups()
        assert stored.pairs == 3
        assert_same_rollup(
            stored,
            rollup_of([facts_from_record(r) for r in [*first, late]], OLD_HOUR, "summarisation"),
        )

    def test_totals_before_equal_raw_plus_rollups_after(
        self, store: SqlStore, pair: Any, failed: Any
    ) -> None:
        """Across batches, hours and categories, raw + roll-ups after equals everything before:
        counts, sums, exact matches, errors and histograms."""
        records: list[PairRecord] = []
        for i in range(13):
            started = NOW - timedelta(days=9, minutes=37 * i)
            category = ("code", "chat", "summarisation")[i % 3]
            if i % 5 == 0:
                records.append(failed(started_at=started, category=category))
            elif i % 4 == 0:
                records.append(
                    pair(
                        started_at=started,
                        category=category,
                        speculative=slow(pair().speculative, 0.4 + i),
                        scores=dataclasses.replace(
                            pair().scores, exact_match=False, task_score_delta=-0.25
                        ),
                    )
                )
            else:
                records.append(pair(started_at=started, category=category))
        records += [pair(started_at=NOW - timedelta(hours=h)) for h in (1, 30)]
        for record in records:
            store.save_pair(record)
        everything = [facts_from_record(r) for r in records]
        expected = rollup_of(everything, OLD_HOUR, "all")

        report = store.apply_retention(
            NOW, raw_retention_days=7, rollup_retention_days=90, batch_pairs=4
        )

        assert report.rolled_up_pairs == 13
        remaining = [facts_from_record(r) for r in store.pairs()]
        assert len(remaining) == 2
        after = total([rollup_of(remaining, OLD_HOUR, "all"), *store.rollups()])
        assert_same_rollup(after, expected)
        assert after.exact_matches == 9  # 15 pairs - 3 failed - 3 mismatched
        assert after.speculative.errors == {ErrorKind.HTTP.value: 3}
        assert row_count(store, PairRow) == 2

    def test_old_rollups_are_pruned(self, store: SqlStore, pair: Any) -> None:
        """Roll-up hours that ended before the roll-up cut-off are deleted; younger ones stay."""
        store.save_pair(pair(started_at=NOW - timedelta(days=100)))
        store.save_pair(pair(started_at=NOW - timedelta(days=89)))
        first = store.apply_retention(NOW, raw_retention_days=7, rollup_retention_days=90)
        assert first == RetentionReport(
            rolled_up_pairs=2, deleted_pairs=2, deleted_rollups=1, deleted_prompts=1
        )
        (kept,) = store.rollups()
        assert kept.hour_start == datetime(2025, 9, 22, 15, tzinfo=UTC)

        later = store.apply_retention(
            NOW + timedelta(days=2), raw_retention_days=7, rollup_retention_days=90
        )

        assert later.deleted_rollups == 1
        assert store.rollups() == []

    def test_rollup_hour_straddling_the_cut_off_is_kept(self, store: SqlStore, pair: Any) -> None:
        """An hour is pruned only once all of it is older than the roll-up cut-off."""
        store.save_pair(pair(started_at=NOW - timedelta(days=90, minutes=20)))
        report = store.apply_retention(NOW, raw_retention_days=7, rollup_retention_days=90)
        assert report.deleted_rollups == 0
        assert len(store.rollups()) == 1

    @pytest.mark.parametrize(
        ("raw_days", "rollup_days"),
        [(0, 90), (-1, 90), (30, 7)],
        ids=["zero", "negative", "inverted"],
    )
    def test_nonsensical_policy_is_refused(
        self, store: SqlStore, raw_days: float, rollup_days: float
    ) -> None:
        """A non-positive raw retention, or roll-ups kept shorter than raw pairs, is refused."""
        with pytest.raises(ValueError, match="retention"):
            store.apply_retention(NOW, raw_days, rollup_days)

    def test_naive_now_is_refused(self, store: SqlStore) -> None:
        """Retention needs a timezone-aware `now`."""
        with pytest.raises(ValueError, match="naive"):
            store.apply_retention(datetime(2025, 12, 20), 7, 90)


def add_run(
    store: SqlStore,
    run: RunInfo,
    run_id: str,
    started: datetime,
    finished: datetime | None,
) -> None:
    store.create_run(dataclasses.replace(run, run_id=run_id, started_at=started))
    if finished is not None:
        store.finish_run(run_id, finished)


def add_audit(store: SqlStore, at: datetime, kind: str, generation: int) -> None:
    with store._sessions.begin() as session:
        session.add(
            SwitchAuditRow(
                at=at,
                kind=kind,
                generation=generation,
                previous="auto",
                target="rolled_back",
                control="manual",
                actor="user:test",
                reason=f"{kind} {generation}",
                evidence=[],
            )
        )


class TestRetentionOfHistoryRows:
    def test_prompts_no_pair_uses_any_more_are_pruned(self, store: SqlStore, pair: Any) -> None:
        """A prompt whose pairs were all rolled up is deleted; one a raw pair still uses
        stays; the deleted one is stored again, unchanged, when it is next run."""
        gone = pair(started_at=OLD, category="code")
        store.save_pair(gone)
        store.save_pair(pair(started_at=NOW - timedelta(hours=1)))
        assert row_count(store, PromptRow) == 2

        report = store.apply_retention(NOW, raw_retention_days=7, rollup_retention_days=90)

        assert report.deleted_prompts == 1
        assert row_count(store, PromptRow) == 1
        again = pair(started_at=NOW, category="code")
        store.save_pair(again)
        assert store.pairs(category="code") == [again]

    def test_finished_runs_without_pairs_are_pruned_past_the_rollup_cut_off(
        self, store: SqlStore, pair: Any, run_info: Any
    ) -> None:
        """Only runs that finished before the roll-up cut-off and have no pairs left go; a
        run that never finished (still running, or killed), a run with pairs and a run
        that finished recently stay."""
        long_ago, run = NOW - timedelta(days=200), run_info()
        add_run(store, run, "old-finished", long_ago, NOW - timedelta(days=100))
        add_run(store, run, "old-unfinished", long_ago, None)
        add_run(store, run, "old-with-pairs", long_ago, NOW - timedelta(days=100))
        add_run(store, run, "recently-finished", long_ago, NOW - timedelta(days=10))
        store.save_pair(pair(run_id="old-with-pairs", started_at=NOW - timedelta(hours=1)))

        report = store.apply_retention(NOW, raw_retention_days=7, rollup_retention_days=90)

        assert report.deleted_runs == 1
        kept = {run.info.run_id for run in store.runs(limit=None)}
        assert kept == {"run-1", "old-unfinished", "old-with-pairs", "recently-finished"}

    def test_old_audit_rows_are_pruned_but_the_newest_transition_is_kept(
        self, store: SqlStore
    ) -> None:
        """Audit rows older than the roll-up cut-off go, except the newest transition,
        which says why the switch is in its state however long ago that was."""
        add_audit(store, NOW - timedelta(days=200), "transition", 1)
        add_audit(store, NOW - timedelta(days=150), "refused", 1)
        add_audit(store, NOW - timedelta(days=120), "transition", 2)
        add_audit(store, NOW - timedelta(days=100), "refused", 2)
        add_audit(store, NOW - timedelta(days=1), "refused", 2)

        report = store.apply_retention(NOW, raw_retention_days=7, rollup_retention_days=90)

        assert report.deleted_audit_rows == 3
        assert [(e.kind, e.generation) for e in store.audit()] == [
            ("transition", 2),
            ("refused", 2),
        ]
        again = store.apply_retention(NOW, raw_retention_days=7, rollup_retention_days=90)
        assert again.deleted_audit_rows == 0

    def test_revisions_whose_window_ended_before_the_cutoff_are_pruned(
        self, store: SqlStore
    ) -> None:
        """A revision followed by another before the roll-up cut-off goes; the one that
        ended after it and each arm's latest stay; a pruned name starts a new window."""
        store.start_revision("spec", "v1", NOW - timedelta(days=200))
        store.start_revision("spec", "v2", NOW - timedelta(days=150))
        store.start_revision("spec", "v3", NOW - timedelta(days=10))
        store.start_revision("other", "only", NOW - timedelta(days=300))

        report = store.apply_retention(NOW, raw_retention_days=7, rollup_retention_days=90)

        assert report.deleted_revisions == 1
        assert store.revision_window("spec", "v1") is None
        v2 = store.revision_window("spec", "v2")
        assert v2 is not None and v2.ended_at == NOW - timedelta(days=10)
        assert store.revision_window("other", "only") is not None
        back = store.start_revision("spec", "v1", NOW)
        assert (back.started_at, back.ended_at) == (NOW, None)
        again = store.apply_retention(NOW, raw_retention_days=7, rollup_retention_days=90)
        assert again.deleted_revisions == 0


class TestRollupArithmetic:
    def test_merge_refuses_different_hours(self) -> None:
        """Merging roll-ups of two different (hour, category) keys is a bug and raises."""
        a = PairRollup(hour_start=OLD_HOUR, category="code")
        b = PairRollup(hour_start=OLD_HOUR + timedelta(hours=1), category="code")
        with pytest.raises(ValueError, match="cannot merge"):
            a.merge(b)

    def test_merge_adds_counts_errors_and_pads_positions(self) -> None:
        """Counts and error kinds add; per-position sums of different draft lengths are padded."""
        a = PairRollup(
            hour_start=OLD_HOUR,
            category="code",
            pairs=2,
            accepted_per_position=(3, 1),
            baseline=ArmRollup(ok=1, errors={"timeout": 1}),
        )
        b = PairRollup(
            hour_start=OLD_HOUR,
            category="code",
            pairs=1,
            accepted_per_position=(1, 1, 1),
            baseline=ArmRollup(ok=0, errors={"timeout": 1, "oom": 1}),
        )
        merged = a.merge(b)
        assert merged.pairs == 3
        assert merged.accepted_per_position == (4, 2, 1)
        assert merged.baseline.errors == {"oom": 1, "timeout": 2}
        assert merged.baseline.ok == 1

    def test_unreported_drafted_figures_add_nothing(self, pair: Any) -> None:
        """A pair whose engine did not report drafted tokens (None) or per-position figures
        (empty) adds its steps and accepted tokens but no drafted count and no positions."""
        reported = pair(pair_id="reported", started_at=OLD)
        stats = reported.speculative.speculative
        assert stats is not None and stats.draft_tokens == 8
        unreported = pair(pair_id="unreported", started_at=OLD)
        unreported = dataclasses.replace(
            unreported,
            speculative=dataclasses.replace(
                unreported.speculative,
                speculative=dataclasses.replace(
                    stats, draft_tokens=None, accepted_per_position=(1, 1), drafted_per_position=()
                ),
            ),
        )
        rollup = rollup_of(
            [facts_from_record(reported), facts_from_record(unreported)], OLD_HOUR, "code"
        )
        assert rollup.speculative_reported == 2
        assert rollup.verify_steps == 2 * stats.verify_steps
        assert rollup.accepted_tokens == 2 * stats.accepted_tokens
        assert rollup.draft_tokens == 8
        assert rollup.accepted_per_position == stats.accepted_per_position
        assert rollup.drafted_per_position == stats.drafted_per_position
