"""`/v1/verdict` and the Flagger webhooks over real HTTP on loopback (`canaryd.server.rollout`
behind the status server), judged from a real SQLite store of pairs that the real pair
runner made over fake engines; only liveness enforces, so a few pairs decide."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from canaryd.config import Settings
from canaryd.judging.verdict import VerdictService
from canaryd.metrics import CanarydMetrics
from canaryd.server.app import MAX_BODY_BYTES, StatusServer
from canaryd.server.rollout import Burst, ProgressiveDelivery
from canaryd.store import SqlStore
from tests.canaryd.judging.test_gatejob import Soak, settings
from tests.canaryd.judging.test_verdict import Clock


def never_finite(constant: str) -> Any:
    raise AssertionError(f"non-finite number {constant} in a JSON body")


class World:
    """A store, a clock, the verdict service and the status server serving it."""

    def __init__(
        self,
        tmp_path: Path,
        *,
        gate_run: bool = True,
        burst: Burst | None = None,
        configured: Settings | None = None,
    ) -> None:
        self.url = f"sqlite:///{tmp_path / 'canaryd.db'}"
        self.settings = configured or settings(self.url, tmp_path)
        self.store = SqlStore.open(self.url, create=True)
        self.soak = Soak(self.store)
        self.clock = Clock(self.soak.base)
        self.service = VerdictService(self.settings, store=self.store, clock=self.clock)
        if gate_run:
            self.store.record_gate_run(self.soak.base - timedelta(seconds=1))

        def probe() -> tuple[bool, dict[str, Any]]:
            return True, {}

        self.server = StatusServer(
            "127.0.0.1:0",
            CanarydMetrics(),
            probe,
            probe,
            judge=ProgressiveDelivery(self.service, burst),
        )
        self.server.start()
        self.client = httpx.Client(base_url=f"http://{self.server.address}", timeout=10)

    def pairs(self, n: int, *, error_rate: float = 0.0) -> None:
        """`n` pairs, then a completed gate run at the clock's new time."""
        self.clock.now = self.soak.pairs(n, error_rate=error_rate)
        self.store.record_gate_run(self.clock.now)

    def later(self) -> None:
        self.clock.now += timedelta(milliseconds=100)

    def verdict(self, **params: str) -> httpx.Response:
        return self.client.get("/v1/verdict", params=params)

    def open(self, **params: str) -> httpx.Response:
        """POST /v1/verdict: opens the revision's window, then answers as GET does."""
        return self.client.post("/v1/verdict", params=params)

    def flagger(self, hook: str, checksum: str, **metadata: str) -> httpx.Response:
        payload = {
            "name": "vllm-spec",
            "namespace": "llm",
            "phase": "Progressing",
            "checksum": checksum,
            "metadata": metadata,
        }
        return self.client.post(f"/v1/flagger/{hook}", json=payload)

    def close(self) -> None:
        self.client.close()
        self.server.stop()
        self.store.close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    made = World(tmp_path)
    yield made
    made.close()


def states(world: World) -> None:
    """Four revisions in four states: `old` PASSed and was superseded, `good` PASSes
    fresh, `bad` FAILs on its own dead arm, `new` has no pairs yet (NODATA)."""
    world.open(revision="old")
    world.pairs(10)
    world.later()
    world.open(revision="good")
    world.pairs(10)
    world.later()
    world.open(revision="bad")
    world.pairs(10, error_rate=1.0)
    world.later()
    world.open(revision="new")


class TestVerdictEndpoint:
    def test_every_verdict_is_200_with_the_contracts_fields(self, world: World) -> None:
        """PASS, FAIL and NODATA all answer 200 with exactly the documented fields, and no
        body holds a non-finite number."""
        states(world)
        seen = {}
        for revision in ("old", "good", "bad", "new"):
            answer = world.verdict(revision=revision)
            assert answer.status_code == 200, answer.text
            body = json.loads(answer.text, parse_constant=never_finite)
            assert set(body) == {
                "verdict",
                "fresh",
                "evaluated_at",
                "age_s",
                "revision",
                "pairs",
                "arms",
                "speculative_enabled",
                "generation",
                "reason",
                "failed_at",
                "estimate",
                "burst",
                "gates",
            }
            assert set(body["estimate"]) == {
                "pairs_to_decision",
                "minutes_to_decision",
                "waiting_on",
            }
            if body["verdict"] in ("PASS", "FAIL"):
                assert body["estimate"]["pairs_to_decision"] == 0
            assert body["burst"] is None  # no burst runs beside this server
            seen[revision] = (body["verdict"], body["fresh"])
        assert seen == {
            "old": ("PASS", False),
            "good": ("PASS", False),  # superseded by `bad`
            "bad": ("FAIL", False),  # superseded by `new`
            "new": ("NODATA", False),
        }

    def test_the_revision_may_come_in_a_header(self, world: World) -> None:
        """`X-Canaryd-Revision` names the revision when the query does not."""
        world.open(revision="good")
        world.pairs(10)
        answer = world.client.get("/v1/verdict", headers={"X-Canaryd-Revision": "good"})
        assert answer.status_code == 200
        assert (answer.json()["verdict"], answer.json()["revision"]) == ("PASS", "good")

    @pytest.mark.parametrize(
        ("query", "key", "says"),
        [
            ("", "revision", "missing: name the revision"),
            ("?revision=a&revison=b", "revison", "unknown query key"),
            ("?revision=a&revision=b", "revision", "given 2 times"),
            ("?revision=a%20b", "revision", "'a b' is not a revision"),
            ("?revision=a&min_pairs=-1", "min_pairs", "'-1' is not a whole number"),
            ("?revision=a&min_pairs=ten", "min_pairs", "'ten' is not a whole number"),
            ("?revision=a&format=xml", "format", "'xml'; expected one of canaryd, kayenta"),
            ("?revision=a&category=", "category", "empty"),
            ("?revision=a&category=nope", "category", "unknown category 'nope'"),
            ("?revision=a&min_pairs=%C2%B2", "min_pairs", "'²' is not a whole number"),
            ("?revision=a&min_pairs=%D9%A3", "min_pairs", "is not a whole number"),
            ("?revision=abc%0A", "revision", "is not a revision"),
            ("?revision=a&category=" + "c" * 5000, "category", "unknown category 'ccc"),
        ],
    )
    def test_bad_input_is_400_naming_the_key(
        self, world: World, query: str, key: str, says: str
    ) -> None:
        """A bad query is a 400 whose body names the key and says what is wrong."""
        answer = world.client.get(f"/v1/verdict{query}")
        assert answer.status_code == 400
        body = answer.json()
        assert body["key"] == key
        assert body["reason"].startswith(f"{key}: ") and says in body["reason"], body

    def test_a_header_that_contradicts_the_query_is_400(self, world: World) -> None:
        """Two different revisions in one request are refused, not guessed between."""
        answer = world.client.get("/v1/verdict?revision=a", headers={"X-Canaryd-Revision": "b"})
        assert answer.status_code == 400 and answer.json()["key"] == "revision"

    def test_503_only_when_canaryd_cannot_judge(self, tmp_path: Path) -> None:
        """Before any gate run has completed the answer is 503 saying so, not a verdict."""
        world = World(tmp_path, gate_run=False)
        try:
            answer = world.verdict(revision="a")
            assert answer.status_code == 503
            assert answer.json()["fresh"] is False
            assert "no gate run has completed yet" in answer.json()["reason"]
        finally:
            world.close()


HOOKS = ("rollout", "confirm-promotion", "rollback")


class TestFlaggerWebhooks:
    def test_each_hook_answers_200_for_yes_and_412_for_no(self, world: World) -> None:
        """rollout is yes unless FAIL; confirm-promotion only on a fresh PASS (a superseded
        revision's PASS is not); rollback only on FAIL; every answer carries the verdict
        and its reason."""
        world.flagger("rollout", "old")
        world.pairs(10)
        world.later()
        world.flagger("rollout", "good")
        world.pairs(10)
        answers = {
            hook: (world.flagger(hook, "old").status_code, world.flagger(hook, "good").status_code)
            for hook in HOOKS
        }
        assert answers == {
            "rollout": (200, 200),
            "confirm-promotion": (412, 200),
            "rollback": (412, 412),
        }
        world.later()
        world.flagger("rollout", "bad")
        world.pairs(10, error_rate=1.0)
        failed = {hook: world.flagger(hook, "bad") for hook in HOOKS}
        assert {hook: a.status_code for hook, a in failed.items()} == {
            "rollout": 412,
            "confirm-promotion": 412,
            "rollback": 200,
        }
        body = failed["rollout"].json()
        assert (body["hook"], body["verdict"], body["revision"]) == ("rollout", "FAIL", "bad")
        assert body["reason"].startswith("liveness FAILed on 10 pairs of revision 'bad'")

    def test_a_new_checksum_is_nodata_and_never_promoted(self, world: World) -> None:
        """The first webhook naming a checksum starts its window: rollout goes on,
        promotion waits, no rollback."""
        answers = {hook: world.flagger(hook, "new") for hook in HOOKS}
        assert {hook: a.status_code for hook, a in answers.items()} == {
            "rollout": 200,
            "confirm-promotion": 412,
            "rollback": 412,
        }
        assert answers["confirm-promotion"].json()["verdict"] == "NODATA"

    def test_metadata_min_pairs_holds_back_the_promotion(self, world: World) -> None:
        """`metadata.min_pairs` above the revision's pairs makes a PASS wait (412, NODATA)."""
        world.flagger("rollout", "good")
        world.pairs(10)
        assert world.flagger("confirm-promotion", "good").status_code == 200
        held = world.flagger("confirm-promotion", "good", min_pairs="50")
        assert held.status_code == 412
        assert held.json()["reason"] == "10 pairs of revision 'good', fewer than min_pairs=50"

    @pytest.mark.parametrize(
        ("body", "key"),
        [
            (b"not json", "body"),
            (b"[]", "body"),
            (b'{"name": "a", "namespace": "b", "phase": "c"}', "checksum"),
            (b'{"name": "a", "namespace": "b", "phase": "c", "checksum": 7}', "checksum"),
            (b'{"name": "a", "phase": "c", "checksum": "x"}', "namespace"),
            (
                b'{"name": "a", "namespace": "b", "phase": "c", "checksum": "x", '
                b'"metadata": {"min_pairs": 3}}',
                "metadata",
            ),
            (
                b'{"name": "a", "namespace": "b", "phase": "c", "checksum": "x", '
                b'"metadata": {"min_pairs": "many"}}',
                "metadata.min_pairs",
            ),
            (b"[" * 20_000 + b"]" * 20_000, "body"),
            (
                b'{"name": "a", "namespace": "b", "phase": "c", "checksum": ' + b"9" * 5000 + b"}",
                "body",
            ),
            (b'{"name": "\xff"}', "body"),
        ],
    )
    def test_a_payload_that_is_not_flaggers_is_400_naming_the_field(
        self, world: World, body: bytes, key: str
    ) -> None:
        """Bad payloads are refused with the field at fault, never judged."""
        answer = world.client.post("/v1/flagger/rollout", content=body)
        assert answer.status_code == 400
        assert answer.json()["key"] == key, answer.json()
        assert len(answer.text) < 1024 and "Traceback" not in answer.text

    def test_unknown_hooks_large_bodies_and_no_judge(self, world: World, tmp_path: Path) -> None:
        """An unknown hook is 404 naming the others; a body over the limit is 413; without
        a completed gate run the hooks answer 503 (Flagger retries), never a verdict."""
        unknown = world.client.post("/v1/flagger/post-rollout", json={})
        assert unknown.status_code == 404 and "confirm-promotion" in unknown.json()["reason"]
        huge = world.client.post("/v1/flagger/rollout", content=b" " * (MAX_BODY_BYTES + 1))
        assert huge.status_code == 413
        (tmp_path / "idle").mkdir()
        idle = World(tmp_path / "idle", gate_run=False)
        try:
            assert idle.flagger("rollback", "x").status_code == 503
        finally:
            idle.close()
