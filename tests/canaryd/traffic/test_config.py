"""`[traffic]` and `[retention]` in the configuration: no listen, no sink; a sink needs
a hash key, named with its variable when missing; bad values name their key."""

from __future__ import annotations

from pathlib import Path

import pytest

from canaryd.config import load_settings
from canaryd.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "canaryd.toml"
    path.write_text(text, encoding="utf-8")
    return path


class TestTrafficConfig:
    def test_no_section_means_no_sink(self, tmp_path: Path) -> None:
        """Without `[traffic] listen` the sink is off and text is not stored."""
        settings = load_settings(write(tmp_path, ""))
        assert not settings.traffic.enabled
        assert settings.traffic.store_text is False
        assert settings.retention.live_text_days == 7.0

    def test_listen_without_hash_key_fails_naming_the_variable(self, tmp_path: Path) -> None:
        """A sink without traffic.hash_key fails at start, saying where to set it."""
        path = write(tmp_path, '[traffic]\nlisten = "127.0.0.1:0"\n')
        with pytest.raises(
            ConfigError, match=r"traffic\.hash_key: required .*CANARYD_TRAFFIC__HASH_KEY"
        ):
            load_settings(path)

    def test_hash_key_from_the_environment(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The key comes from the environment; it never shows in the run's snapshot."""
        monkeypatch.setenv("CANARYD_TRAFFIC__HASH_KEY", "0123456789abcdef0123")
        settings = load_settings(write(tmp_path, '[traffic]\nlisten = "127.0.0.1:0"\n'))
        assert settings.traffic.enabled
        assert "0123456789abcdef0123" not in repr(settings.snapshot())

    @pytest.mark.parametrize(
        ("text", "key"),
        [
            ('listen = "nowhere"', "traffic.listen"),
            ("live_share = 1.5", "traffic.live_share"),
            ('category_header = "X Bad"', "traffic.category_header"),
            ("max_prompts_per_minute = 0", "traffic.max_prompts_per_minute"),
            ('categories = ["Code Review"]', "traffic.categories"),
            ('unknown_category = "drop"', "traffic.unknown_category"),
            ('categories = ["a", "b"]\nmax_categories = 2', "traffic.categories"),
        ],
    )
    def test_bad_values_name_their_key(self, tmp_path: Path, text: str, key: str) -> None:
        """Each bad `[traffic]` value fails naming its key."""
        with pytest.raises(ConfigError, match=rf"{key.replace('.', '[.]')}: "):
            load_settings(write(tmp_path, f"[traffic]\n{text}\n"))

    def test_categories_are_listed_once_and_unknown_is_live(self, tmp_path: Path) -> None:
        """The allowlist is read as given (duplicates once); unlisted requests are `live`
        unless `unknown_category = "refuse"`."""
        text = '[traffic]\ncategories = ["live_code", "support", "live_code"]\n'
        traffic = load_settings(write(tmp_path, text)).traffic
        assert (traffic.categories, traffic.unknown_category) == (["live_code", "support"], "live")

    def test_retention_must_be_positive(self, tmp_path: Path) -> None:
        """retention.live_text_days must be greater than 0."""
        with pytest.raises(ConfigError, match=r"retention\.live_text_days: "):
            load_settings(write(tmp_path, "[retention]\nlive_text_days = 0\n"))
