"""Named speculative arms in the store, on SQLite and PostgreSQL: pairs keep their arm and
group, reads filter by arm, roll-ups are kept per arm, comparison arms' gate decisions
stay out of the switch's reach, and the migration names existing rows `speculative`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from alembic import command
from sqlalchemy import text

from canaryd.store import SqlStore, upgrade
from canaryd.store.database import make_engine
from canaryd.store.migrations import alembic_config
from engine.types import DraftCost
from gates import Evaluation, GateDecision, GateMode, GateState, SwitchOutcome, SwitchState
from gates.records import PairRecord, RunInfo

T0 = datetime(2025, 11, 29, 12, 0, 0, 123456, tzinfo=UTC)  # the builders' start time
PairFactory = Callable[..., PairRecord]


def group(pair: PairFactory, group_id: str, **changes: object) -> list[PairRecord]:
    """One prompt on two speculative arms: the records share the group and the baseline."""
    return [
        pair(pair_id=f"{group_id}-hydra", arm="hydra", group_id=group_id, **changes),
        pair(pair_id=f"{group_id}-medusa", arm="medusa", group_id=group_id, **changes),
    ]


def decision(name: str, state: GateState) -> GateDecision:
    return GateDecision(
        name=name, state=state, mode=GateMode.ENFORCE, critical=True, evaluated_at=T0
    )


class TestPairsOfArms:
    def test_arm_and_group_round_trip(self, store: SqlStore, pair: PairFactory) -> None:
        """A record reads back with its arm, its group and its draft cost."""
        cost = DraftCost(draft_s=0.01, verify_s=0.04, tree_tokens=9)
        hydra, medusa = group(pair, "g-1")
        hydra = replace(hydra, speculative=replace(hydra.speculative, draft_cost=cost))
        for record in (hydra, medusa):
            store.save_pair(record)
        assert store.pairs() == sorted([hydra, medusa], key=lambda r: r.pair_id)
        assert store.pairs()[0].speculative.draft_cost == cost
        assert store.pairs()[1].speculative.draft_cost is None

    def test_reads_filter_by_arm(self, store: SqlStore, pair: PairFactory) -> None:
        """`pairs(arm=…)` returns only that arm's records; without it, every arm's."""
        for n in range(3):
            for record in group(pair, f"g-{n}", started_at=T0 + timedelta(seconds=n)):
                store.save_pair(record)
        assert [r.pair_id for r in store.pairs(arm="medusa")] == [f"g-{n}-medusa" for n in range(3)]
        assert [r.arm for r in store.pairs(arm="hydra", limit=2)] == ["hydra", "hydra"]
        assert store.pairs(arm="speculative") == []
        assert len(store.pairs()) == 6

    def test_history_and_rollups_are_per_arm(self, store: SqlStore, pair: PairFactory) -> None:
        """Facts carry their arm, and retention rolls each arm up on its own row, so each
        arm's roll-up counts its pairs (and the baseline it was compared with) once."""
        old = T0 - timedelta(days=40)
        for n in range(2):
            for record in group(pair, f"g-{n}", started_at=old + timedelta(seconds=n)):
                store.save_pair(record)
        store.save_pair(pair(pair_id="lone", started_at=T0))
        facts = store.history(old - timedelta(hours=1), T0 + timedelta(hours=1)).pairs
        assert sorted(f.arm for f in facts) == ["hydra", "hydra", "medusa", "medusa", "speculative"]
        report = store.apply_retention(T0 + timedelta(minutes=1), 30, 365)
        assert report.rolled_up_pairs == 4
        rollups = store.rollups()
        assert sorted((r.arm, r.pairs, r.baseline.ok) for r in rollups) == [
            ("hydra", 2, 2),
            ("medusa", 2, 2),
        ]
        # Rolled up again later (another batch of the same hour): merged into the same row.
        store.save_pair(pair(pair_id="late", arm="hydra", started_at=old + timedelta(seconds=5)))
        store.apply_retention(T0 + timedelta(minutes=2), 30, 365)
        assert {r.arm: r.pairs for r in store.rollups()} == {"hydra": 3, "medusa": 2}

    def test_run_keeps_every_arms_identity(
        self, store: SqlStore, run_info: Callable[..., RunInfo]
    ) -> None:
        """A run reads back with the identity of each arm and knows its switch's arm."""
        run = replace(
            run_info("run-2"),
            config={"switch": {"arm": "medusa"}},
            arm_identities={"hydra": {"method": "heads"}, "medusa": {"method": "heads2"}},
        )
        store.create_run(run)
        stored = store.runs_by_id(["run-2", "run-1"])
        assert stored["run-2"].info == run
        assert stored["run-2"].switch_arm == "medusa"
        assert stored["run-2"].arms == ["medusa", "hydra"]
        assert stored["run-1"].switch_arm == "speculative"


class TestComparisonEvaluations:
    def test_the_switch_reads_only_its_arms_evaluations(self, store: SqlStore) -> None:
        """Evaluations saved for a comparison arm are read back under its name and never
        reach the switch's evaluations, nor the policy's input in `change_switch`."""
        ours = Evaluation(T0, (decision("liveness", GateState.PASS),))
        theirs = Evaluation(T0 + timedelta(seconds=1), (decision("liveness", GateState.FAIL),))
        store.save_evaluation(ours)
        store.save_evaluation(theirs, comparison_arm="medusa")
        assert store.evaluations(5) == [ours]
        assert store.latest_evaluation() == ours
        assert store.latest_evaluation(comparison_arm="medusa") == theirs
        assert store.evaluations(5, comparison_arm="hydra") == []
        seen: list[list[Evaluation]] = []

        def decide(state: SwitchState, evaluations: list[Evaluation]) -> SwitchOutcome:
            seen.append(evaluations)
            return SwitchOutcome(state)

        store.change_switch(decide, now=T0 + timedelta(seconds=2), history=5)
        assert seen == [[ours]]
        store.prune_gate_decisions(T0 + timedelta(seconds=5))
        assert store.latest_evaluation(comparison_arm="medusa") is None


class TestMigration:
    def test_rows_before_named_arms_are_the_speculative_arm(
        self, database_url: str, pair: PairFactory, run_info: Callable[..., RunInfo]
    ) -> None:
        """Down to the schema before named arms (other arms' rows cannot stay), then up
        again: the remaining pair is arm `speculative` and its own group."""
        upgrade(database_url)
        with SqlStore.open(database_url) as store:
            store.create_run(run_info())
            store.save_pair(pair(pair_id="p-old", group_id="g-old"))
            store.save_pair(pair(pair_id="p-hydra", arm="hydra"))
            store.save_evaluation(
                Evaluation(T0, (decision("liveness", GateState.PASS),)), comparison_arm="hydra"
            )
        engine = make_engine(database_url)
        try:
            with engine.begin() as connection:
                config = alembic_config()
                config.attributes["connection"] = connection
                command.downgrade(config, "0006")
            with engine.connect() as connection:
                ids = connection.execute(text("SELECT pair_id FROM pairs")).scalars().all()
                decisions = connection.execute(text("SELECT count(*) FROM gate_decisions"))
                assert ids == ["p-old"] and decisions.scalar_one() == 0
        finally:
            engine.dispose()
        upgrade(database_url)
        with SqlStore.open(database_url) as store:
            [stored] = store.pairs()
        assert (stored.pair_id, stored.arm, stored.group_id) == ("p-old", "speculative", "p-old")
