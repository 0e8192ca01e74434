"""canaryd.config.arms: an arm's key changes with the baseline's or that arm's
configuration and with nothing else, so evidence of one arm outlives changes to another."""

from __future__ import annotations

from typing import Any

from canaryd.config import Settings
from canaryd.config.arms import arm_key, arm_pair_config, arms_key


def settings(**draft_tokens: int) -> Settings:
    """A fake baseline and one fake speculative arm per keyword, each drafting its own
    number of tokens."""
    arms: dict[str, Any] = {"baseline": {"kind": "fake"}}
    for name, tokens in draft_tokens.items():
        arms[name] = {"kind": "fake", "speculative": True, "num_draft_tokens": tokens}
    return Settings(arms=arms, switch={"arm": next(iter(draft_tokens))})


class TestArmKey:
    def test_another_arm_changing_leaves_the_key(self) -> None:
        """A comparison arm added or changed keeps the switch arm's key."""
        assert arm_key(settings(spec=5), "spec") == arm_key(settings(spec=5, other=3), "spec")
        assert arm_key(settings(spec=5, other=3), "spec") == arm_key(
            settings(spec=5, other=7), "spec"
        )

    def test_the_arm_changing_changes_the_key(self) -> None:
        """Another draft length is another key, and each arm has its own."""
        assert arm_key(settings(spec=5), "spec") != arm_key(settings(spec=6), "spec")
        assert arm_key(settings(spec=5, other=5), "spec") != arm_key(
            settings(spec=5, other=5), "other"
        )

    def test_the_key_of_a_stored_snapshot_is_the_key_now(self) -> None:
        """The key of a run's stored `arms` section equals `arm_key` of the same settings:
        evidence stored then is found now."""
        config = settings(spec=5)
        stored = config.snapshot()["arms"]
        assert arms_key(arm_pair_config(stored, "spec")) == arm_key(config, "spec")
        assert len(arm_key(config, "spec")) == 16


class TestArmPairConfig:
    def test_the_baseline_and_the_arm_only(self) -> None:
        """Of a snapshot's arms, the baseline and the one arm; None for an arm not there
        or a section that is not one."""
        arms = {"baseline": {"kind": "hf"}, "spec": {"n": 1}, "other": {"n": 2}}
        assert arm_pair_config(arms, "spec") == {"baseline": {"kind": "hf"}, "spec": {"n": 1}}
        assert arm_pair_config(arms, "gone") is None
        assert arm_pair_config(None, "spec") is None
