"""Loading canaryd.toml: a schedule faster than the false-alarm budget's design rate is
refused, naming both keys and the ways out, unless the config re-budgets."""

from __future__ import annotations

from pathlib import Path

import pytest

from canaryd.config import Settings, load_settings
from canaryd.config.sections import interval_for, pairs_per_minute
from canaryd.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "canaryd.toml"
    path.write_text(text)
    return path


class TestScheduleRate:
    def test_three_pairs_a_cycle_at_the_design_interval_are_refused(self, tmp_path: Path) -> None:
        """3 pairs every 10 s is 18 a minute, 3x the design rate: one line names the file,
        the schedule's and the budget's keys, and each way out."""
        path = write(tmp_path, "[schedule]\npair_interval_s = 10\npairs_per_cycle = 3\n")
        with pytest.raises(ConfigError) as caught:
            load_settings(path)
        message = str(caught.value)
        assert "\n" not in message
        assert message.startswith(f"{path}: schedule.pairs_per_cycle: ")
        assert (
            "schedule.pairs_per_cycle = 3 every schedule.pair_interval_s = 10 s is 18 pairs a "
            "minute, 3x the 6 the false-alarm budget is sized for "
            "(gates.budget.design_pair_interval_s = 10 s): slow the schedule "
            "(pair_interval_s >= 30), or re-budget with gates.budget.design_pair_interval_s "
            "= 3.33 (every detector threshold rises by log(3) nats) or "
            'gates.budget.over_design_rate = "rebudget"'
        ) in message

    def test_a_single_pair_faster_than_designed_names_the_interval(self) -> None:
        """One pair a cycle, every 5 s: the error is on schedule.pair_interval_s."""
        with pytest.raises(ValueError, match=r"schedule\.pair_interval_s\n.*2x the 6"):
            Settings(schedule={"pair_interval_s": 5})

    @pytest.mark.parametrize(
        ("schedule", "budget"),
        [
            ({}, {}),  # the default: one pair every 30 s
            ({"pair_interval_s": 10}, {}),  # exactly the design rate
            ({"pair_interval_s": 30, "pairs_per_cycle": 3}, {}),
            ({"pair_interval_s": 10, "pairs_per_cycle": 3}, {"design_pair_interval_s": 10 / 3}),
            ({"pair_interval_s": 0.05}, {"over_design_rate": "rebudget"}),
        ],
    )
    def test_schedules_within_the_budget_or_rebudgeted_load(
        self, schedule: dict[str, float], budget: dict[str, object]
    ) -> None:
        """The default schedule, the design rate itself, a re-sized budget and an explicit
        `rebudget` all load."""
        settings = Settings(schedule=schedule, gates={"budget": budget})
        assert settings.schedule.pairs_per_minute > 0

    def test_the_shipped_example_config_loads(self) -> None:
        """docs/canaryd.example.toml keeps within its own budget."""
        example = Path(__file__).resolve().parents[2] / "docs" / "canaryd.example.toml"
        settings = load_settings(example)
        rate = settings.schedule.pairs_per_minute
        assert rate <= 60 / settings.gates.budget.design_pair_interval_s


class TestPairRateRule:
    def test_the_rate_and_the_interval_are_one_rule_both_ways(self) -> None:
        """3 pairs every 10 s is 18 a minute, and 18 a minute in cycles of 3 is one every
        10 s; the schedule's rate is that rule on its own keys."""
        assert pairs_per_minute(3, 10.0) == 18.0
        assert interval_for(3, 18.0) == 10.0
        assert interval_for(4, 30.0) == 8.0
        schedule = Settings(schedule={"pair_interval_s": 30, "pairs_per_cycle": 3}).schedule
        assert schedule.pairs_per_minute == pairs_per_minute(3, 30.0) == 6.0
