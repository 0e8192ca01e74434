"""The mirror sink against hostile clients, over real HTTP on loopback: malformed bodies
are 400, counted, and leave no trace of their text in the log or the metrics; log lines
about them are rate-limited; a body that trickles in is cut at the deadline (408)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from canaryd.config import LoggingConfig, TrafficConfig
from canaryd.logs import configure_logging
from canaryd.metrics import CanarydMetrics
from canaryd.server.app import REQUEST_DEADLINE_S
from canaryd.traffic import LiveSampler, SamplingBounds, TrafficSink
from canaryd.traffic.sink import bodies_in_flight

KEY = "k" * 32
MARKER = "zebra-ledger-marker"
CHAT = "/v1/chat/completions"


def malformed_bodies() -> dict[str, bytes]:
    """One body of each kind that once answered 500 with a traceback, the marker inside."""
    user = {"role": "user", "content": f"my card is {MARKER}"}
    plain = json.dumps({"messages": [user]}).encode()
    conversation = [
        {"role": "system", "content": f"{MARKER} bank bot"},
        {"role": "user", "content": f"my card is {MARKER} \udc80"},
    ]
    return {
        "lone surrogate": json.dumps({"messages": conversation}).encode(),
        "5,000-digit integer": plain[:-1] + b', "max_tokens": ' + b"9" * 5000 + b"}",
        "20k-deep nesting": plain[:-1] + b', "x": ' + b"[" * 20_000 + b"]" * 20_000 + b"}",
        "invalid UTF-8": plain[:-4] + b' \xff\xfe"}]}',
    }


@pytest.fixture
def metrics() -> CanarydMetrics:
    return CanarydMetrics()


@pytest.fixture
def sink(request: pytest.FixtureRequest, metrics: CanarydMetrics) -> Iterator[TrafficSink]:
    options: dict[str, Any] = getattr(request, "param", {})
    config = TrafficConfig(listen="127.0.0.1:0", hash_key=KEY)
    sampler = LiveSampler(SamplingBounds.of(config), seed=0, observe=metrics.traffic.request)
    with TrafficSink(config, sampler, **options) as started:
        yield started


def settle(sink: TrafficSink, received: int) -> None:
    """Wait until the sink has counted `received` requests (it counts after answering)."""
    deadline = time.monotonic() + 5
    while sink.counts["received"] < received and time.monotonic() < deadline:
        time.sleep(0.01)


class TestMalformedBodies:
    @pytest.mark.parametrize("renderer", ["json", "console"])
    def test_each_is_400_counted_and_never_in_the_log_or_metrics(
        self,
        sink: TrafficSink,
        metrics: CanarydMetrics,
        capfd: pytest.CaptureFixture[str],
        renderer: str,
    ) -> None:
        """A lone surrogate, a 5,000-digit integer, 20k-deep nesting and invalid UTF-8
        are each answered 400 with a short reason and counted `unusable`; the marker
        text inside them is in no log line (JSON or console, tracebacks included), no
        answer and no metric."""
        configure_logging(LoggingConfig(level="DEBUG"), json=renderer == "json")
        bodies = malformed_bodies()
        with httpx.Client(base_url=f"http://{sink.address}", timeout=10) as client:
            answers = {
                kind: client.post(CHAT, content=raw, headers={"content-type": "application/json"})
                for kind, raw in bodies.items()
            }
            rendered = metrics.render().decode()
        assert {kind: a.status_code for kind, a in answers.items()} == dict.fromkeys(bodies, 400)
        for answer in answers.values():
            assert answer.json()["status"] == "unusable"
            assert len(answer.content) < 200
            assert MARKER not in answer.text
        settle(sink, len(bodies))
        assert (sink.counts["unusable"], sink.counts["received"]) == (len(bodies), len(bodies))
        assert 'canaryd_traffic_requests_total{outcome="unusable"} 4.0' in rendered
        assert MARKER not in rendered
        captured = capfd.readouterr()
        logged = captured.out + captured.err
        assert "traffic.rejected" in logged
        assert MARKER not in logged
        assert "Traceback" not in logged

    def test_a_thousand_give_a_bounded_number_of_log_lines(
        self, sink: TrafficSink, capfd: pytest.CaptureFixture[str]
    ) -> None:
        """1,000 malformed bodies are 1,000 counted 400s and one log line (one a minute
        per outcome), not a line or a traceback each."""
        configure_logging(LoggingConfig(level="DEBUG"), json=True)
        bodies = list(malformed_bodies().values())
        with httpx.Client(base_url=f"http://{sink.address}", timeout=10) as client:
            statuses = {client.post(CHAT, content=bodies[i % 4]).status_code for i in range(1000)}
        assert statuses == {400}
        settle(sink, 1000)
        assert sink.counts["unusable"] == 1000
        captured = capfd.readouterr()
        lines = (captured.out + captured.err).splitlines()
        assert len(lines) <= 3, lines[:5]
        assert sum(len(line) for line in lines) < 4096
        (rejected,) = [json.loads(line) for line in lines if "traffic.rejected" in line]
        assert (rejected["outcome"], rejected["suppressed"]) == ("unusable", 0)


def slow_request(address: str, declared: int) -> socket.socket:
    """A connection that sends a chat request's headers, declaring `declared` body bytes."""
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: sink\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % declared
    )
    return sock


def drip_until_answered(sock: socket.socket, limit_s: float) -> tuple[bytes, float]:
    """Send one body byte every 0.1 s until the sink answers or closes (what it sent,
    after how long), or `limit_s` passes."""
    started = time.monotonic()
    sock.settimeout(0.1)
    while time.monotonic() - started < limit_s:
        try:
            sock.sendall(b" ")
        except OSError:
            break  # closed by the sink
        try:
            answer = sock.recv(4096)
        except TimeoutError:
            continue
        except OSError:
            answer = b""
        return answer, time.monotonic() - started
    return b"", time.monotonic() - started


# The whole-body deadline of the dripping-body test: long enough that a request beside
# the dripping body is answered well before it even on a loaded CI machine, so a sink
# that made it wait for the drip (until the deadline) cannot pass.
DRIP_DEADLINE_S = 2.0


class TestSlowBodies:
    @pytest.mark.parametrize("sink", [{"body_deadline_s": DRIP_DEADLINE_S}], indirect=True)
    def test_a_dripping_body_is_408_at_the_deadline(self, sink: TrafficSink) -> None:
        """A body sent one byte every 0.1 s (each byte would restart a per-read timer)
        is answered 408 once the whole-body deadline has passed, counted `too_slow`;
        requests meanwhile are answered at once."""
        sock = slow_request(sink.address, 60_000)
        try:
            with httpx.Client(base_url=f"http://{sink.address}", timeout=5) as client:
                started = time.monotonic()
                body = {"messages": [{"role": "user", "content": "q"}]}
                assert client.post(CHAT, json=body).status_code == 202
                assert time.monotonic() - started < DRIP_DEADLINE_S - 0.5
            answer, after_s = drip_until_answered(sock, DRIP_DEADLINE_S + 3.0)
        finally:
            sock.close()
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert after_s < DRIP_DEADLINE_S + 1.0
        settle(sink, 2)
        assert sink.counts["too_slow"] == 1

    def test_the_default_deadline_ends_a_trickling_body(self, sink: TrafficSink) -> None:
        """With the server's own REQUEST_DEADLINE_S, a trickling body is ended (408, or
        the connection closed) within the deadline and a second, and counted `too_slow`,
        never read as a malformed body."""
        sock = slow_request(sink.address, 1000)
        try:
            sock.sendall(f'{{"messages": [{{"role": "user", "content": "{MARKER}'.encode())
            answer, after_s = drip_until_answered(sock, REQUEST_DEADLINE_S + 3)
        finally:
            sock.close()
        assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer
        assert after_s < REQUEST_DEADLINE_S + 1
        settle(sink, 1)
        assert (sink.counts["too_slow"], sink.counts["unusable"]) == (1, 0)


class TestBodiesInFlight:
    def test_bodies_in_flight_hold_at_most_64_mib(self) -> None:
        """However large a body may be, the bodies read at once may hold 64 MiB (and at
        least 16 are read at once), as the status port caps its own."""
        assert bodies_in_flight(1024 * 1024) == 64
        assert bodies_in_flight(64 * 1024 * 1024) == 16

    def test_beyond_the_cap_a_request_is_503_before_a_byte_is_read(
        self, metrics: CanarydMetrics
    ) -> None:
        """With as many slow bodies in flight as the cap, the next request is answered 503
        at once and counted `busy`; once they are gone a request is accepted again."""
        config = TrafficConfig(listen="127.0.0.1:0", hash_key=KEY, max_body_bytes=64 * 1024 * 1024)
        sampler = LiveSampler(SamplingBounds.of(config), seed=0, observe=metrics.traffic.request)
        body = {"messages": [{"role": "user", "content": "q"}]}
        with TrafficSink(config, sampler, body_deadline_s=30.0) as sink:
            slow = [slow_request(sink.address, 60_000) for _ in range(16)]
            try:
                for sock in slow:
                    sock.sendall(b"{")
                time.sleep(0.5)
                with httpx.Client(base_url=f"http://{sink.address}", timeout=5) as client:
                    started = time.monotonic()
                    answer = client.post(CHAT, json=body)
                    assert answer.status_code == 503, answer.text
                    assert time.monotonic() - started < 1.0
                    assert "16 request bodies" in answer.json()["reason"]
            finally:
                for sock in slow:
                    sock.close()
            deadline = time.monotonic() + 5
            while sink.counts["busy"] < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert sink.counts["busy"] == 1
            with httpx.Client(base_url=f"http://{sink.address}", timeout=5) as client:
                deadline = time.monotonic() + 5
                while (status := client.post(CHAT, json=body).status_code) == 503:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
                assert status == 202
