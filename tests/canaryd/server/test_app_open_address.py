"""Writes that cost GPU time need authority (canaryd.server.app): on an address that is
not loopback and without `server.auth_token`, `POST /v1/verdict` and the Flagger webhooks
(which start a rollout burst) answer 403 naming the key and start nothing; with the token,
they burst. Reads, probes and `/metrics` stay open. Real HTTP, the server bound to every
address and reached on loopback."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from canaryd.daemon.burst import RolloutBurst
from canaryd.judging.verdict import VerdictService
from canaryd.metrics import CanarydMetrics
from canaryd.server.app import StatusServer
from canaryd.server.rollout import ProgressiveDelivery
from canaryd.store import SqlStore
from tests.canaryd.judging.test_gatejob import Soak, settings
from tests.canaryd.judging.test_verdict import Clock

TOKEN = "s3cret-token-for-open-address"
FLAGGER = {"name": "spec", "namespace": "llm", "phase": "Progressing", "checksum": "abc"}

Serve = Callable[[str, str | None], tuple[httpx.Client, RolloutBurst]]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    """Starts a status server on `listen` with `token` and a rollout burst; returns a
    client on loopback and the burst. Stopped after the test."""
    url = f"sqlite:///{tmp_path / 'canaryd.db'}"
    store = SqlStore.open(url, create=True)
    soak = Soak(store)
    store.record_gate_run(soak.base)
    configured = settings(url, tmp_path)
    service = VerdictService(configured, store=store, clock=Clock(soak.base))
    started: list[tuple[StatusServer, httpx.Client]] = []

    def probe() -> tuple[bool, dict[str, Any]]:
        return True, {}

    def start(listen: str, token: str | None) -> tuple[httpx.Client, RolloutBurst]:
        burst = RolloutBurst(lambda: configured)
        server = StatusServer(
            listen,
            CanarydMetrics(),
            probe,
            probe,
            judge=ProgressiveDelivery(service, burst),
            token=token,
        )
        server.start()
        port = server.address.rpartition(":")[2]
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
        started.append((server, client))
        return client, burst

    yield start
    for server, client in started:
        client.close()
        server.stop()
    store.close()


class TestOpenAddressWithoutToken:
    def test_a_post_that_would_start_a_burst_is_refused_naming_the_key(self, serve: Serve) -> None:
        """`server.listen = "0.0.0.0:…"`, no token: POST /v1/verdict and a Flagger hook
        answer 403 naming `server.auth_token`; no revision is named to the burst."""
        client, burst = serve("0.0.0.0:0", None)
        for answer in (
            client.post("/v1/verdict", params={"revision": "x"}),
            client.post("/v1/flagger/pre-rollout", json=FLAGGER),
            client.post("/v1/flagger/rollout", json=FLAGGER),
        ):
            assert answer.status_code == 403, answer.text
            assert "server.auth_token" in answer.json()["reason"]
            assert "CANARYD_SERVER__AUTH_TOKEN" in answer.json()["reason"]
        assert burst.query is None and not burst.active()

    def test_reads_and_probes_stay_open(self, serve: Serve) -> None:
        """A read starts no burst: GET /v1/verdict, the probes and /metrics answer."""
        client, _ = serve("0.0.0.0:0", None)
        assert client.get("/v1/verdict", params={"revision": "x"}).status_code == 200
        for path in ("/healthz", "/readyz", "/metrics"):
            assert client.get(path).status_code == 200, path

    def test_on_loopback_the_post_needs_no_token(self, serve: Serve) -> None:
        """Only this host reaches a loopback address: the POST bursts without a token."""
        client, burst = serve("127.0.0.1:0", None)
        answer = client.post("/v1/verdict", params={"revision": "x"})
        assert answer.status_code == 200, answer.text
        assert burst.query is not None and burst.query.revision == "x"


class TestOpenAddressWithToken:
    def test_the_bearer_token_bursts(self, serve: Serve) -> None:
        """With the token, the same POST opens the window and the burst runs for it;
        without it, 401."""
        client, burst = serve("0.0.0.0:0", TOKEN)
        assert client.post("/v1/verdict", params={"revision": "x"}).status_code == 401
        assert burst.query is None
        answer = client.post(
            "/v1/verdict", params={"revision": "x"}, headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert answer.status_code == 200, answer.text
        assert burst.query is not None and burst.query.revision == "x"
        assert burst.active()

    def test_flagger_passes_the_token_in_metadata(self, serve: Serve) -> None:
        """Flagger's webhooks carry no headers: the token in the webhook's `metadata`
        opens the hook (never the query string, which Flagger repeats in its events);
        a wrong one is 401."""
        client, burst = serve("0.0.0.0:0", TOKEN)
        wrong = client.post(
            "/v1/flagger/pre-rollout", json={**FLAGGER, "metadata": {"token": "no"}}
        )
        assert wrong.status_code == 401 and wrong.headers["www-authenticate"].startswith("Bearer")
        assert TOKEN not in wrong.text
        hook = client.post(
            "/v1/flagger/pre-rollout", json={**FLAGGER, "metadata": {"token": TOKEN}}
        )
        assert hook.status_code == 200, hook.text
        assert burst.query is not None and burst.query.revision == "abc"
