"""Bearer-token authentication on the rollout endpoints (canaryd.server.app): with
`server.auth_token` set, `/v1/verdict` and the Flagger webhooks answer 401 without it;
the probes, `/metrics` and `/v1/switch` stay open. Real HTTP on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from canaryd.config import Settings
from canaryd.judging.verdict import VerdictService
from canaryd.metrics import CanarydMetrics
from canaryd.server.app import StatusServer
from canaryd.server.rollout import ProgressiveDelivery
from canaryd.store import SqlStore
from tests.canaryd.judging.test_gatejob import Soak, settings
from tests.canaryd.judging.test_verdict import Clock

TOKEN = "s3cret-token-for-tests"


@pytest.fixture
def client(tmp_path: Path) -> Iterator[httpx.Client]:
    url = f"sqlite:///{tmp_path / 'canaryd.db'}"
    store = SqlStore.open(url, create=True)
    soak = Soak(store)
    store.record_gate_run(soak.base)
    service = VerdictService(settings(url, tmp_path), store=store, clock=Clock(soak.base))

    def probe() -> tuple[bool, dict[str, Any]]:
        return True, {}

    server = StatusServer(
        "127.0.0.1:0",
        CanarydMetrics(),
        probe,
        probe,
        switch=lambda: {"speculative_enabled": True, "generation": 1},
        judge=ProgressiveDelivery(service),
        token=TOKEN,
    )
    server.start()
    with httpx.Client(base_url=f"http://{server.address}", timeout=10) as made:
        yield made
    server.stop()
    store.close()


FLAGGER = {"name": "spec", "namespace": "llm", "phase": "Progressing", "checksum": "abc"}


class TestBearerToken:
    def test_rollout_endpoints_need_the_token(self, client: httpx.Client) -> None:
        for answer in (
            client.get("/v1/verdict", params={"revision": "abc"}),
            client.get(
                "/v1/verdict",
                params={"revision": "abc"},
                headers={"Authorization": "Bearer wrong"},
            ),
            client.post("/v1/flagger/rollout", json=FLAGGER),
        ):
            assert answer.status_code == 401, answer.text
            assert answer.headers["www-authenticate"].startswith("Bearer")
            assert TOKEN not in answer.text

    def test_the_token_opens_them(self, client: httpx.Client) -> None:
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        verdict = client.get("/v1/verdict", params={"revision": "abc"}, headers=bearer)
        assert verdict.status_code == 200, verdict.text
        assert verdict.json()["verdict"] == "NODATA"
        # Flagger's webhooks send no headers: the token rides on the webhook URL
        hook = client.post("/v1/flagger/rollout", params={"token": TOKEN}, json=FLAGGER)
        assert hook.status_code != 401, hook.text

    def test_probes_metrics_and_switch_stay_open(self, client: httpx.Client) -> None:
        for path in ("/healthz", "/readyz", "/metrics", "/v1/switch"):
            assert client.get(path).status_code == 200, path


def test_the_token_is_a_secret_in_the_settings() -> None:
    """Set from the environment (an EnvironmentFile); never shown in the settings' repr
    or their stored snapshot."""
    configured = Settings(server={"auth_token": TOKEN})
    assert configured.server.auth_token is not None
    assert configured.server.auth_token.get_secret_value() == TOKEN
    assert TOKEN not in repr(configured)
    assert TOKEN not in str(configured.snapshot())
