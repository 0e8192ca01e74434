"""Logs and the redaction behind them: no credential reaches a log line, whichever logger
wrote it, and prompt/output text stays out unless `include_text` is set."""

from __future__ import annotations

import json
import logging

import pytest
import structlog

from canaryd.config import LoggingConfig
from canaryd.logs import configure_logging
from canaryd.redact import is_secret_key, public_url, redact_text, redact_value


def json_logs() -> None:
    # In the test itself: structlog binds the stderr of the moment it is configured,
    # and capsys swaps stderr between a fixture's set-up and the test.
    configure_logging(LoggingConfig(level="DEBUG"), json=True)


def lines(captured: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in captured.splitlines() if line.startswith("{")]


class TestRedactText:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("postgresql+psycopg://canaryd:hunter2@db:5432/x", "postgresql+psycopg://canaryd:***@db:5432/x"),
            ("dsn host=db password=hunter2 dbname=x", "dsn host=db password=*** dbname=x"),
            ("GET /v1?api_key=hunter2&model=m", "GET /v1?api_key=***&model=m"),
            ("Authorization: Bearer hunter2", "Authorization: Bearer ***"),
            ("sent bearer hunter2.x-y", "sent bearer ***"),
            ("url='https://u:hunter2@h/p'", "url='https://u:***@h/p'"),
        ],
    )  # fmt: skip
    def test_masks_credentials(self, text: str, expected: str) -> None:
        """URL passwords, secret parameters and authorization values are masked."""
        assert redact_text(text) == expected

    @pytest.mark.parametrize(
        "text",
        [
            "pair.done output_tokens=12 category=qa",
            "http://127.0.0.1:9466/metrics",
            "first token after 0.2 s",
            "sqlite:////var/lib/canaryd/canaryd.db",
        ],
    )
    def test_leaves_ordinary_text_alone(self, text: str) -> None:
        """Text without credentials is unchanged."""
        assert redact_text(text) == text

    def test_secret_named_keys(self) -> None:
        """Values under credential names are masked whole; counts named "tokens" are not."""
        assert all(map(is_secret_key, ["password", "api_key", "apiKey", "webhook-secret"]))
        assert not any(map(is_secret_key, ["output_tokens", "keys", "monkey", "tokenizer"]))
        value = {
            "api_key": "sk-1",
            "output_tokens": 3,
            "token_ids": [1, 2],  # a secret-sounding key, but only strings are masked
            "nested": [{"password": "p"}],
        }
        assert redact_value(value) == {
            "api_key": "***",
            "output_tokens": 3,
            "token_ids": [1, 2],
            "nested": [{"password": "***"}],
        }

    def test_public_url_keeps_only_scheme_host_port_and_path(self) -> None:
        """Userinfo, query and fragment are dropped from an exported URL."""
        assert public_url("https://u:p@h.example:8443/v1?key=s#f") == "https://h.example:8443/v1"
        assert public_url("http://[::1]:8000") == "http://[::1]:8000"
        assert public_url("not a url with password=x") == "not a url with password=***"


class TestLogLines:
    def test_credentials_in_event_fields_are_masked(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A URL with a password, a `password=` parameter and an `api_key` field are
        masked in the rendered line; other fields are kept."""
        json_logs()
        structlog.get_logger("t").error(
            "database.unreachable",
            reason="cannot connect to postgresql://canaryd:hunter2@db/x (password=hunter2)",
            api_key="sk-hunter2",
            output_tokens=5,
        )
        err = capsys.readouterr().err
        assert "hunter2" not in err
        (line,) = lines(err)
        assert line["api_key"] == "***" and line["output_tokens"] == 5
        assert "postgresql://canaryd:***@db/x" in str(line["reason"])

    def test_a_logged_traceback_is_masked(self, capsys: pytest.CaptureFixture[str]) -> None:
        """The rendered exception of `log.exception` carries no credential either."""
        json_logs()
        try:
            raise RuntimeError("connect to https://user:hunter2@example.org failed")
        except RuntimeError:
            structlog.get_logger("t").exception("hook.failed")
        err = capsys.readouterr().err
        assert "hunter2" not in err and "RuntimeError" in err

    def test_standard_library_loggers_are_masked(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A third-party logger (SQLAlchemy, APScheduler) goes through the same filter."""
        json_logs()
        logging.getLogger("sqlalchemy.pool").warning("reconnecting to postgresql://u:hunter2@db/x")
        err = capsys.readouterr().err
        assert "hunter2" not in err and "postgresql://u:***@db/x" in err

    def test_prompt_and_output_text_are_dropped(self, capsys: pytest.CaptureFixture[str]) -> None:
        """Without `include_text`, the text keys never reach a line."""
        json_logs()
        structlog.get_logger("t").info("pair.text", prompt_text="secret prompt", pair_id="p1")
        (line,) = lines(capsys.readouterr().err)
        assert "prompt_text" not in line and line["pair_id"] == "p1"
