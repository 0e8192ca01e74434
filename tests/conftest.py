"""Fixtures shared by every test package.

`database_url` runs a test once per supported database: a fresh SQLite file, and a fresh
PostgreSQL schema on the server named by CANARYD_TEST_PG_URL (set by `make test` from
`.ci/services.sh`). Without that variable the PostgreSQL case is skipped, except under
CI=true, where a missing server is a failure rather than a silent pass.

Every test also ends with no thread of its own still running: a thread it started must
finish within two seconds of the test and its fixtures ending.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

PG_URL_ENV = "CANARYD_TEST_PG_URL"
# How long a thread a test started may take to finish after the test (and its fixtures):
# generous, because a process pool's manager thread ends only when its worker process has
# exited, which takes seconds on a loaded CI machine; a thread that ends sooner costs
# nothing (the wait is a join).
THREAD_GRACE_S = 15.0
# True: a thread still running after the grace fails the test; False: it is only warned.
FAIL_ON_LEFT_THREADS = True
# Threads a library starts once per process and keeps: tqdm's monitor (started by the first
# progress bar, e.g. transformers' save_pretrained) outlives every bar by design.
PROCESS_WIDE_THREADS = frozenset({"tqdm_monitor"})


class ThreadLeftRunningWarning(UserWarning):
    """A test (or one of its function-scoped fixtures) left a thread running."""


def postgres_base_url() -> str:
    """The test server's URL, or skip (fail under CI=true) when none is configured."""
    url = os.environ.get(PG_URL_ENV, "").strip()
    if url:
        return url
    reason = f"{PG_URL_ENV} is not set (run `bash .ci/services.sh`, or `make test`)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"PostgreSQL is required under CI=true: {reason}")
    pytest.skip(reason)


def _postgres_schema_url(base: str, schema: str) -> str:
    """`base` with a search_path of only `schema`, labelled with it as application_name."""
    url = make_url(base)
    if url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    # The application_name lets a test find (and terminate) exactly this test's sessions.
    url = url.update_query_dict({"options": f"-csearch_path={schema}", "application_name": schema})
    return url.render_as_string(hide_password=False)


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
    ]
)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database for one test: a SQLite file, or a PostgreSQL schema of its own."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'canaryd.db'}"
        return
    base = postgres_base_url()
    schema = f"canaryd_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(_postgres_schema_url(base, "public"))
    with admin.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield _postgres_schema_url(base, schema)
    finally:
        with admin.begin() as connection:
            connection.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = :schema AND pid <> pg_backend_pid()"
                ),
                {"schema": schema},
            )
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(autouse=True)
def _reset_structlog() -> Iterator[None]:
    """CLI commands configure structlog to write to the stderr of the moment; a test's
    captured stderr is closed afterwards, so every test starts from the defaults."""
    import structlog

    yield
    structlog.reset_defaults()


@pytest.fixture(autouse=True)
def _no_installed_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command reads /etc/canaryd/canaryd.toml when no config is named; on a host
    where canaryd is installed, tests must not pick it up."""
    from canaryd import config

    monkeypatch.setattr(config, "DEFAULT_CONFIG_PATH", Path("/nonexistent/canaryd/canaryd.toml"))


@pytest.fixture(autouse=True)
def _no_thread_left_running(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every thread a test starts is finished when it ends: engines, servers and pools are
    closed by the test or its fixtures. Threads of module- and session-scoped fixtures are
    started before this fixture and are not counted."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + THREAD_GRACE_S
    left = [
        t for t in threading.enumerate() if t not in before and t.name not in PROCESS_WIDE_THREADS
    ]
    while left and time.monotonic() < deadline:
        left[0].join(timeout=max(0.0, deadline - time.monotonic()))
        left = [t for t in left if t.is_alive()]
    if not left:
        return
    names = ", ".join(sorted(t.name for t in left))
    message = f"{request.node.nodeid} left {len(left)} thread(s) running: {names}"
    if FAIL_ON_LEFT_THREADS:
        pytest.fail(message, pytrace=False)
    warnings.warn(message, ThreadLeftRunningWarning, stacklevel=1)
