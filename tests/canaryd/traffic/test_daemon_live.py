"""The daemon with a mirror sink, on fake arms: a mirrored request becomes a stored live
pair in its listed category, with its own sampling and no text (the database file holds
none of the prompt); suites keep running as the control beside it; malformed mirrored
bodies leave no trace of their text in the log, the database or `/metrics`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from canaryd.config import LoggingConfig, load_settings
from canaryd.daemon import Daemon
from canaryd.logs import configure_logging
from canaryd.traffic.requests import prompt_hash
from engine.types import Message
from tests.canaryd.daemon.test_daemon import FAKE_ARMS, fast_schedule, wait_for, write_config
from tests.canaryd.traffic.test_sink_hostile import MARKER, malformed_bodies

KEY = "0123456789abcdef0123456789abcdef"
SECRET = "zebra quartz ledger secret prompt"


@pytest.fixture(autouse=True)
def _clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CANARYD_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("CANARYD_TRAFFIC__HASH_KEY", KEY)
    for name in ("CANARYD_CONFIG", "CANARYD_STORAGE__URL", "CANARYD_SERVER__LISTEN"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def make_daemon(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    started: list[Daemon] = []

    def make(traffic: str) -> Daemon:
        path = write_config(tmp_path, fast_schedule() + traffic, arms=FAKE_ARMS)
        daemon = Daemon(load_settings(path), config_path=path)
        daemon.start()
        started.append(daemon)
        return daemon

    yield make
    for daemon in started:
        daemon.stop()


def rows(daemon: Daemon, query: str, **params: Any) -> list[Any]:
    engine = create_engine(daemon.settings.storage.resolved_url())
    try:
        with engine.connect() as connection:
            return list(connection.execute(text(query), params))
    finally:
        engine.dispose()


def mirror(daemon: Daemon) -> None:
    body = {
        "model": "prod-model",
        "messages": [{"role": "user", "content": SECRET}],
        "temperature": 0.5,
        "max_tokens": 4096,
        "stream": True,
    }
    answer = httpx.post(
        f"http://{daemon.traffic_address}/v1/chat/completions",
        json=body,
        headers={"X-Canaryd-Category": "support"},
        timeout=5,
    )
    assert answer.status_code == 202
    assert daemon.traffic is not None
    daemon.traffic.flush()  # end the minute now: the sample goes to the queue


def live_pairs(daemon: Daemon) -> list[Any]:
    return rows(
        daemon,
        "SELECT p.pair_id, p.category, p.temperature, pr.prompt_id, pr.messages, "
        "pr.max_tokens FROM pairs p JOIN prompts pr ON pr.id = p.prompt_ref "
        "WHERE p.source = 'live'",
    )


class TestLivePairs:
    def test_a_mirrored_request_becomes_a_live_pair_without_text(
        self, make_daemon: Callable[..., Daemon], tmp_path: Path
    ) -> None:
        """The request is stored as a live pair: its category from the header, its own
        temperature, max_tokens capped, the keyed hash as prompt id, no messages, no
        output text or token ids; the database file holds no trace of the prompt."""
        daemon = make_daemon(
            '[traffic]\nlisten = "127.0.0.1:0"\nlive_share = 0.5\ncategories = ["support"]\n'
        )
        mirror(daemon)
        (pair,) = wait_for(lambda: live_pairs(daemon), what="a live pair")
        _, category, temperature, prompt_id, messages, max_tokens = pair
        assert (category, temperature, max_tokens) == ("support", 0.5, 512)
        expected = prompt_hash(KEY.encode(), (Message(role="user", content=SECRET),))
        assert prompt_id == expected
        assert messages in ("[]", [])
        generations = rows(
            daemon,
            "SELECT text, token_ids, output_tokens FROM generations WHERE pair_id = :pair",
            pair=pair[0],
        )
        assert [(g[0], g[1] in ("[]", [])) for g in generations] == [("", True)] * 2
        assert all(g[2] > 0 for g in generations)
        wait_for(
            lambda: rows(daemon, "SELECT 1 FROM pairs WHERE source = 'control'"),
            what="control pairs beside it",
        )
        daemon.stop()
        for path in tmp_path.rglob("*"):
            if path.is_file():
                assert SECRET.encode() not in path.read_bytes(), path
        assert (
            daemon.metrics.registry.get_sample_value(
                "canaryd_traffic_requests_total", {"outcome": "sampled"}
            )
            == 1.0
        )

    def test_store_text_keeps_the_text(self, make_daemon: Callable[..., Daemon]) -> None:
        """With traffic.store_text = true the live pair keeps its messages and outputs."""
        daemon = make_daemon(
            '[traffic]\nlisten = "127.0.0.1:0"\nlive_share = 1.0\nstore_text = true\n'
        )
        mirror(daemon)
        (pair,) = wait_for(lambda: live_pairs(daemon), what="a live pair")
        assert SECRET in str(pair[4])
        texts = rows(daemon, "SELECT text FROM generations WHERE pair_id = :pair", pair=pair[0])
        assert all(row[0] for row in texts)


class TestHostileBodies:
    def test_malformed_bodies_leave_no_text_in_log_database_or_metrics(
        self,
        make_daemon: Callable[..., Daemon],
        tmp_path: Path,
        capfd: pytest.CaptureFixture[str],
    ) -> None:
        """Malformed mirrored bodies (lone surrogate, 5,000-digit integer, 20k-deep
        nesting, invalid UTF-8) are 400 and counted `unusable` in `/metrics`; their
        marker text is in no log line, no database file and no metric."""
        configure_logging(LoggingConfig(level="DEBUG"), json=True)
        daemon = make_daemon(
            '[traffic]\nlisten = "127.0.0.1:0"\nlive_share = 1.0\nstore_text = true\n'
        )
        bodies = malformed_bodies()
        for raw in bodies.values():
            answer = httpx.post(
                f"http://{daemon.traffic_address}/v1/chat/completions", content=raw, timeout=10
            )
            assert answer.status_code == 400
        assert daemon.traffic is not None
        daemon.traffic.flush()
        wait_for(
            lambda: rows(daemon, "SELECT 1 FROM pairs WHERE source = 'control'"),
            what="pairs after the bodies",
        )
        scraped = httpx.get(f"http://{daemon.address}/metrics", timeout=10).text
        assert f'canaryd_traffic_requests_total{{outcome="unusable"}} {len(bodies)}.0' in scraped
        assert MARKER not in scraped
        assert not live_pairs(daemon)
        daemon.stop()
        for path in tmp_path.rglob("*"):
            if path.is_file():
                assert MARKER.encode() not in path.read_bytes(), path
        captured = capfd.readouterr()
        assert "traffic.rejected" in captured.err
        assert MARKER not in captured.out + captured.err
