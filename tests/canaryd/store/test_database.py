"""URL handling and connection limits of canaryd/store/database.py."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from canaryd.config import Settings
from canaryd.store.database import (
    POSTGRESQL_IDLE_IN_TRANSACTION_TIMEOUT_MS,
    POSTGRESQL_LOCK_TIMEOUT_MS,
    POSTGRESQL_STATEMENT_TIMEOUT_MS,
    _postgresql_limits,
    make_engine,
    mask_url,
)


class TestMaskUrl:
    @pytest.mark.parametrize(
        "url",
        [
            "postgresql+psycopg://canary:s3cret@db.internal/canaryd",
            "postgresql+psycopg://canary@db.internal/canaryd?password=s3cret",
            "postgresql+psycopg://canary@db.internal/canaryd?sslmode=require&PASSWORD=s3cret",
            "not a url://canary:s3cret@host/?password=s3cret",
        ],
    )
    def test_no_password_survives(self, url: str) -> None:
        """A password in the netloc or as a `?password=` parameter (any case) is masked,
        even in a URL that does not parse."""
        masked = mask_url(url)
        assert "s3cret" not in masked
        assert "***" in masked

    def test_other_parameters_are_kept(self) -> None:
        """Only secrets are masked: sslmode and the host stay readable."""
        masked = mask_url("postgresql+psycopg://u:pw@db/x?sslmode=require&password=pw")
        assert "sslmode=require" in masked and "@db/x" in masked


class TestSnapshot:
    def test_the_stored_config_has_no_database_password(self) -> None:
        """The snapshot stored with every run (readable by dashboards) masks the password."""
        settings = Settings.model_validate(
            {"storage": {"url": "postgresql+psycopg://canary:s3cret@db/canaryd?password=s3cret"}}
        )
        snapshot = settings.snapshot()
        assert "s3cret" not in str(snapshot)
        assert snapshot["storage"]["url"].startswith("postgresql+psycopg://canary:***@db/")

    def test_the_stored_config_has_no_engine_credentials(self) -> None:
        """Credentials in an OpenAI-compatible arm's base_url are masked in the snapshot."""
        settings = Settings.model_validate(
            {
                "arms": {
                    "speculative": {
                        "kind": "openai",
                        "base_url": "http://canary:s3cret@vllm:8000?api_key=s3cret",
                        "speculative": True,
                    }
                }
            }
        )
        assert "s3cret" not in str(settings.snapshot())


@pytest.mark.postgres
class TestPostgresqlLimits:
    def test_sessions_carry_statement_and_lock_timeouts(self, database_url: str) -> None:
        """Every session canaryd opens on PostgreSQL has a statement and a lock timeout, so
        a held row lock fails the statement instead of hanging the kill switch."""
        if not database_url.startswith("postgresql"):
            pytest.skip("PostgreSQL only")
        engine = make_engine(database_url)
        try:
            with engine.connect() as connection:
                statement = connection.execute(text("SHOW statement_timeout")).scalar_one()
                lock = connection.execute(text("SHOW lock_timeout")).scalar_one()
                idle = connection.execute(
                    text("SHOW idle_in_transaction_session_timeout")
                ).scalar_one()
        finally:
            engine.dispose()
        assert statement == f"{POSTGRESQL_STATEMENT_TIMEOUT_MS // 1000}s"
        assert lock == f"{POSTGRESQL_LOCK_TIMEOUT_MS // 1000}s"
        assert POSTGRESQL_IDLE_IN_TRANSACTION_TIMEOUT_MS == 60_000
        assert idle == "1min"  # how PostgreSQL shows 60,000 ms


class TestPostgresqlLimitOverrides:
    def test_a_limit_named_in_the_url_options_is_left_to_the_url(self) -> None:
        """`?options=-c lock_timeout=…` keeps the URL's lock timeout; the other defaults stay."""
        limits = _postgresql_limits("-csearch_path=x -c lock_timeout=500")
        assert "lock_timeout" not in limits
        assert f"statement_timeout={POSTGRESQL_STATEMENT_TIMEOUT_MS}" in limits
        assert "idle_in_transaction_session_timeout" in limits
