"""The one reading of durations and `--since`: units, ISO times, and the errors' lines."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from canaryd.durations import parse_duration, parse_since
from canaryd.errors import CanarydError, DurationError, SinceError

NOW = datetime(2025, 12, 2, 12, 0, tzinfo=UTC)


class TestParseDuration:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("90s", timedelta(seconds=90)),
            ("30m", timedelta(minutes=30)),
            ("24h", timedelta(hours=24)),
            ("7d", timedelta(days=7)),
            ("2w", timedelta(weeks=2)),
            ("1.5h", timedelta(minutes=90)),
            (" 24h ", timedelta(hours=24)),
        ],
    )
    def test_units(self, text: str, expected: timedelta) -> None:
        """A positive number and one of s, m, h, d, w."""
        assert parse_duration(text) == expected

    @pytest.mark.parametrize("bad", ["", "24", "h", "0h", "-1h", "3y", "24 h", "1h30m"])
    def test_anything_else_is_refused(self, bad: str) -> None:
        """DurationError is a ValueError and a CanarydError naming the value and the forms."""
        with pytest.raises(DurationError) as caught:
            parse_duration(bad)
        assert isinstance(caught.value, ValueError) and isinstance(caught.value, CanarydError)
        assert caught.value.value == bad
        assert str(caught.value) == f"{bad!r} is not a duration like 90s, 30m, 24h, 7d or 2w"


class TestParseSince:
    def test_duration_back_from_now(self) -> None:
        assert parse_since("2w", NOW) == NOW - timedelta(weeks=2)

    def test_iso_time_with_zone(self) -> None:
        plus_one = timezone(timedelta(hours=1))
        assert parse_since("2025-12-01T08:00:00+01:00", NOW) == datetime(
            2025, 12, 1, 8, tzinfo=plus_one
        )

    def test_iso_time_without_zone_is_utc(self) -> None:
        assert parse_since("2025-12-01T08:00", NOW) == datetime(2025, 12, 1, 8, tzinfo=UTC)

    @pytest.mark.parametrize("bad", ["yesterday", "0h", "", "3y"])
    def test_neither_is_refused(self, bad: str) -> None:
        """SinceError keeps the value and builds its line from it."""
        with pytest.raises(SinceError) as caught:
            parse_since(bad, NOW)
        assert caught.value.value == bad
        assert str(caught.value).startswith(f"--since {bad!r}: expected a duration")
        assert caught.value.exit_code == 2
