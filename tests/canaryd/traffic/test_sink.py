"""The mirror sink over real HTTP on loopback: a small 202 at once (never a stream),
bearer-token auth, the body-size cap, unknown paths, live categories only from the
gateway's header and the allowlist, and every request counted."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import structlog

from canaryd.config import TrafficConfig
from canaryd.errors import TrafficSinkError
from canaryd.server.app import bind_listen
from canaryd.traffic import LiveSampler, SamplingBounds, TrafficSink

KEY = "k" * 32
TOKEN = "sink-token-for-tests"
HEADER = "X-Canaryd-Category"
CHAT: dict[str, Any] = {
    "model": "m",
    "messages": [{"role": "user", "content": "secret prompt"}],
    "stream": True,
}


def config(**changes: Any) -> TrafficConfig:
    return TrafficConfig(listen="127.0.0.1:0", hash_key=KEY, **changes)


@pytest.fixture
def sink(request: pytest.FixtureRequest) -> Iterator[TrafficSink]:
    changes = getattr(request, "param", {})
    made = config(**changes)
    # One sampling minute for the whole test (a real clock may cross into the next).
    sampler = LiveSampler(SamplingBounds.of(made), seed=0, clock=lambda: 0.0)
    with TrafficSink(made, sampler) as started:
        yield started


def post(sink: TrafficSink, path: str, body: Any, **kwargs: Any) -> httpx.Response:
    with httpx.Client(base_url=f"http://{sink.address}", timeout=5) as client:
        return client.post(path, content=json.dumps(body).encode(), **kwargs)


def taken_categories(sink: TrafficSink) -> list[str]:
    """End the sampling minute; the categories of everything it queued, sorted."""
    sink.sampler.flush()
    taken = []
    while (request := sink.sampler.take()) is not None:
        taken.append(request.category)
    return sorted(taken)


class TestAnswers:
    @pytest.mark.parametrize("sink", [{"categories": ["code"]}], indirect=True)
    def test_chat_and_completions_answer_202_and_are_offered(self, sink: TrafficSink) -> None:
        """Both endpoints (and a route prefix) answer a small JSON 202, not a stream, and
        the requests reach the sampler with their category."""
        answers = [
            post(sink, "/v1/chat/completions", CHAT, headers={HEADER: "code"}),
            post(sink, "/v1/completions", {"prompt": "p"}),
            post(sink, "/code/v1/chat/completions", {"messages": CHAT["messages"][:1]}),
        ]
        assert [a.status_code for a in answers] == [202, 202, 202]
        assert answers[0].json() == {"status": "accepted"}
        assert answers[0].headers["content-type"] == "application/json"
        assert taken_categories(sink) == ["code", "live"]
        # the third repeated the first one's messages: a duplicate
        assert sink.counts["duplicate"] == 1
        assert sink.counts["received"] == 3

    def test_unusable_unknown_and_wrong_method_are_counted(self, sink: TrafficSink) -> None:
        """A body a pair cannot replay is 400, another path or a GET 404; all counted."""
        assert post(sink, "/v1/chat/completions", {"messages": "x"}).status_code == 400
        assert post(sink, "/v1/embeddings", CHAT).status_code == 404
        with httpx.Client(base_url=f"http://{sink.address}", timeout=5) as client:
            assert client.get("/v1/chat/completions").status_code == 404
        counts = sink.counts
        assert (counts["unusable"], counts["not_found"], counts["received"]) == (1, 2, 3)

    @pytest.mark.parametrize("sink", [{"max_body_bytes": 2048}], indirect=True)
    def test_body_over_the_cap_is_413_unread(self, sink: TrafficSink) -> None:
        """A body over max_body_bytes is answered 413 and counted too_large, whether its
        length is declared or streamed in chunks."""
        big = {"messages": [{"role": "user", "content": "x" * 4096}]}
        assert post(sink, "/v1/chat/completions", big).status_code == 413

        def chunks() -> Iterator[bytes]:
            yield b'{"messages": [{"role": "user", "content": "'
            for _ in range(8):
                yield b"y" * 512
            yield b'"}]}'

        with httpx.Client(base_url=f"http://{sink.address}", timeout=5) as client:
            assert client.post("/v1/chat/completions", content=chunks()).status_code == 413
        assert sink.counts["too_large"] == 2

    def test_a_request_beyond_the_connection_budget_is_503_and_counted_busy(self) -> None:
        """Beyond the open-connection budget a mirrored request is answered 503 before its
        body is read, and counted (`busy`), so `received` still adds up."""
        made = config()
        sampler = LiveSampler(SamplingBounds.of(made), seed=0, clock=lambda: 0.0)
        with TrafficSink(made, sampler, max_connections=2) as sink:
            host, port = sink.address.rsplit(":", 1)
            idle = [socket.create_connection((host, int(port)), timeout=5) for _ in range(2)]
            try:
                with httpx.Client(base_url=f"http://{sink.address}", timeout=5) as client:
                    answer = client.post("/v1/chat/completions", content=json.dumps(CHAT))
                assert answer.status_code == 503
            finally:
                for connection in idle:
                    connection.close()
            counts = sink.counts
        assert (counts["busy"], counts["received"]) == (1, 1)


class TestCategories:
    @pytest.mark.parametrize(
        "sink", [{"categories": ["live_code"], "max_prompts_per_minute": 20}], indirect=True
    )
    def test_only_listed_header_values_make_categories(self, sink: TrafficSink) -> None:
        """Junk categories, from the header, the body's `model` or the path, are all the
        one `live` category: 40 of them take one category's share of the sample, and
        the listed `live_code` keeps its own."""
        for i in range(40):
            body = {"model": f"junk{i}", "messages": [{"role": "user", "content": f"j{i}"}]}
            assert post(sink, f"/junk{i}/v1/chat/completions", body).status_code == 202
            headers = {HEADER: f"junk_header_{i}"}
            body = {"messages": [{"role": "user", "content": f"h{i}"}]}
            assert post(sink, "/v1/chat/completions", body, headers=headers).status_code == 202
        for i in range(4):
            body = {"messages": [{"role": "user", "content": f"code {i}"}]}
            answer = post(sink, "/v1/chat/completions", body, headers={HEADER: "Live-Code"})
            assert answer.status_code == 202
        assert taken_categories(sink) == ["live", "live", "live_code", "live_code"]
        assert sink.counts["categories"] == 0

    @pytest.mark.parametrize("sink", [{"categories": ["support"]}], indirect=True)
    def test_unlisted_values_are_logged_once_without_the_value(self, sink: TrafficSink) -> None:
        """Requests naming unlisted categories make one rate-limited log line that masks
        the header's value (a client's, when the gateway does not strip it)."""
        with structlog.testing.capture_logs() as logs:
            for i in range(5):
                headers = {HEADER: f"junk_value_{i}"}
                assert post(sink, "/v1/chat/completions", CHAT, headers=headers).status_code == 202
        (line,) = [entry for entry in logs if entry["event"] == "traffic.category_unlisted"]
        assert line["headers"][HEADER.lower()] == "***"
        assert line["suppressed"] == 0
        assert "junk_value" not in repr(logs)

    @pytest.mark.parametrize(
        "sink", [{"categories": ["support"], "unknown_category": "refuse"}], indirect=True
    )
    def test_refuse_answers_422_and_counts_unlisted(self, sink: TrafficSink) -> None:
        """With unknown_category = "refuse", a request without a listed category is 422,
        counted `unlisted` and never sampled; a listed one is accepted."""
        assert post(sink, "/v1/chat/completions", CHAT).status_code == 422
        junk = post(sink, "/v1/chat/completions", CHAT, headers={HEADER: "junk"})
        assert junk.status_code == 422
        assert "junk" not in junk.text
        assert (
            post(sink, "/v1/chat/completions", CHAT, headers={HEADER: "support"}).status_code == 202
        )
        assert taken_categories(sink) == ["support"]
        assert (sink.counts["unlisted"], sink.counts["received"]) == (2, 3)


class TestAuth:
    @pytest.mark.parametrize("sink", [{"auth_token": TOKEN}], indirect=True)
    def test_token_is_required_when_set(self, sink: TrafficSink) -> None:
        """With traffic.auth_token, no or a wrong bearer token is 401; the right one 202."""
        assert post(sink, "/v1/chat/completions", CHAT).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert post(sink, "/v1/chat/completions", CHAT, headers=wrong).status_code == 401
        right = {"Authorization": f"Bearer {TOKEN}"}
        assert post(sink, "/v1/chat/completions", CHAT, headers=right).status_code == 202
        assert sink.counts["unauthorized"] == 2

    @pytest.mark.parametrize("sink", [{"auth_token": TOKEN}], indirect=True)
    def test_rejection_log_redacts_headers_and_never_shows_the_body(
        self, sink: TrafficSink
    ) -> None:
        """A rejected request's log line masks the redacted headers and holds no body."""
        with structlog.testing.capture_logs() as logs:
            post(
                sink,
                "/v1/chat/completions",
                CHAT,
                headers={"Authorization": "Bearer nope", "X-Trace": "t1"},
            )
        (line,) = [entry for entry in logs if entry["event"] == "traffic.rejected"]
        assert line["headers"]["authorization"] == "***"
        assert line["headers"]["x-trace"] == "t1"
        assert "secret prompt" not in repr(logs)


class TestLifecycle:
    def test_an_address_in_use_names_the_key(self, sink: TrafficSink) -> None:
        """Binding a port already served fails naming traffic.listen."""
        other = TrafficSink(TrafficConfig(listen=sink.address, hash_key=KEY), sink.sampler)
        with pytest.raises(TrafficSinkError, match=r"set traffic\.listen"):
            other.start()

    def test_the_listening_socket_is_tcp_so_answers_are_not_delayed(self) -> None:
        """bind_listen names IPPROTO_TCP: asyncio then turns Nagle off on every accepted
        connection (a two-part answer would otherwise wait for a delayed ACK, 40 ms)."""
        sock = bind_listen("127.0.0.1", 0, "127.0.0.1:0")
        try:
            assert sock.proto == socket.IPPROTO_TCP
        finally:
            sock.close()
