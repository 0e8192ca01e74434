"""The mirror sink behind a real gateway: its cost to production, its bounds, its memory.

A real nginx (Debian's package) proxies chat requests to a stand-in production server (a
uvicorn app that answers a small completion after `--upstream-delay-ms`) on two ports
side by side: one plain, one with `mirror` to canaryd's sink (`canaryd.traffic.
TrafficSink`, in a process of its own, a thread taking its queue as the daemon would).

Reported:
- latency: the same requests sent alternately to the plain port and the mirroring one,
  one client, one run; ratio = mirror on / mirror off, of the median and of the p99
  (goal: median ratio <= 1.02);
- bounds: mirrored requests of `--categories` categories at full speed for several
  sampling windows (shortened to `--window-s` so that a run takes seconds); the largest
  number sampled in a window against `max_prompts_per_minute`, and per category against
  `max_per_category_per_minute` (goal: never above, exactly at it when more arrive);
- memory: the sink's RSS after 0 … `--rss-requests` distinct mirrored requests, sent to
  the sink directly (the gateway adds nothing to the sink's memory), every request a new
  prompt: the dedup memory and reservoirs at their worst (goal: flat once the bounded
  structures are full).

nginx must be installed (`bash .ci/services.sh` installs Debian's package); there is no
Python stand-in for it here.

Usage: .venv/bin/python benchmarks/mirror_sink.py [--requests 1500] [--rss-requests 100000]
       [--upstream-delay-ms 5] [--tiny]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

KEY = "benchmark-hash-key-0123456789abcdef"
PER_MINUTE = 6
PER_CATEGORY = 2
START_WAIT_S = 15.0
_REPORT = "REPORT "
_ANSWER = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "A canary sings."},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13},
    }
).encode()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_listening(port: int, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port} within {START_WAIT_S:g} s")


# --- the processes: production stand-in, sink, nginx --------------------------------------


def serve_upstream(port: int, delay_s: float) -> None:
    """The production stand-in: every POST answered with a small completion after
    `delay_s` (a model's time to answer)."""
    import uvicorn

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body", False):
            pass
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(_ANSWER)),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": _ANSWER})

    uvicorn.run(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="off"
    )


def serve_sink(port: int, window_s: float) -> None:
    """canaryd's sink on `port`, its queue drained as the daemon would; a line `report`
    on stdin prints its counts, the sampled count of each window and its RSS."""
    from canaryd.config import TrafficConfig
    from canaryd.traffic import LiveSampler, SamplingBounds, TrafficSink

    config = TrafficConfig(
        listen=f"127.0.0.1:{port}",
        hash_key=KEY,
        max_prompts_per_minute=PER_MINUTE,
        max_per_category_per_minute=PER_CATEGORY,
        # the categories the requests below name (with `live`, max_categories in all)
        categories=["bench", *(f"category{i}" for i in range(30))],
    )
    per_window: list[dict[str, int]] = []
    sampler = LiveSampler(SamplingBounds.of(config), seed=0, window_s=window_s)

    def drain() -> None:
        while True:
            taken: dict[str, int] = {}
            while (request := sampler.take()) is not None:
                taken[request.category] = taken.get(request.category, 0) + 1
            if taken:
                per_window.append(taken)
            time.sleep(window_s / 20)

    threading.Thread(target=drain, daemon=True).start()
    with TrafficSink(config, sampler):
        for line in sys.stdin:
            if line.strip() == "report":
                report = {
                    "counts": sampler.counts,
                    "sampled_by_window": list(sampler.sampled_by_window),
                    "taken_by_window": per_window[-64:],
                    "rss_kb": rss_kb(os.getpid()),
                }
                print(_REPORT + json.dumps(report), flush=True)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


NGINX_CONF = """
worker_processes 1;
daemon off;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    upstream production {{ server 127.0.0.1:{upstream}; keepalive 32; }}
    upstream canaryd_sink {{ server 127.0.0.1:{sink}; keepalive 32; }}
    server {{
        listen 127.0.0.1:{off};
        location / {{
            proxy_pass http://production;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
    server {{
        listen 127.0.0.1:{on};
        location / {{
            mirror /_canaryd_mirror;
            mirror_request_body on;
            proxy_pass http://production;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
        location = /_canaryd_mirror {{
            internal;
            proxy_pass http://canaryd_sink$request_uri;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_connect_timeout 1s;
            proxy_read_timeout 1s;
        }}
    }}
}}
"""


@dataclass
class Setup:
    off: str  # nginx, plain
    on: str  # nginx, mirroring to the sink
    sink: str
    sink_process: subprocess.Popen[str]

    def report(self) -> dict[str, Any]:
        assert self.sink_process.stdin is not None and self.sink_process.stdout is not None
        self.sink_process.stdin.write("report\n")
        self.sink_process.stdin.flush()
        while True:  # the sink's own log lines may come first
            line = self.sink_process.stdout.readline()
            if not line:
                raise RuntimeError("the sink exited")
            if line.startswith(_REPORT):
                answer: dict[str, Any] = json.loads(line.removeprefix(_REPORT))
                return answer


def _stop(process: subprocess.Popen[Any]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def started(nginx: str, delay_s: float, window_s: float) -> Iterator[Setup]:
    upstream, sink, off, on = (free_port() for _ in range(4))
    me = str(Path(__file__).resolve())
    with ExitStack() as stack:
        prefix = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mirror-sink-")))
        for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (prefix / name).mkdir()
        production = subprocess.Popen(
            [
                sys.executable,
                me,
                "--serve-upstream",
                str(upstream),
                "--upstream-delay-ms",
                str(delay_s * 1000),
            ]
        )
        stack.callback(_stop, production)
        sink_process = subprocess.Popen(
            [sys.executable, me, "--serve-sink", str(sink), "--window-s", str(window_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        stack.callback(_stop, sink_process)
        conf = prefix / "nginx.conf"
        conf.write_text(
            NGINX_CONF.format(prefix=prefix, upstream=upstream, sink=sink, off=off, on=on)
        )
        gateway = subprocess.Popen(
            [nginx, "-p", str(prefix), "-c", str(conf)], stderr=subprocess.DEVNULL
        )
        stack.callback(_stop, gateway)
        wait_listening(upstream, production, "the production stand-in")
        wait_listening(sink, sink_process, "the sink")  # type: ignore[arg-type]
        wait_listening(on, gateway, "nginx")
        yield Setup(
            f"http://127.0.0.1:{off}",
            f"http://127.0.0.1:{on}",
            f"http://127.0.0.1:{sink}",
            sink_process,
        )


# --- the measurements ---------------------------------------------------------------------


def chat(i: int, category: str = "bench", phase: str = "latency") -> dict[str, Any]:
    """A distinct prompt per (`phase`, `i`): no phase's prompts are another's duplicates."""
    question = f"{phase} question {i}: what do canaries sing about?"
    return {
        "model": category,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 16,
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency(setup: Setup, requests: int) -> dict[str, float]:
    """Alternate plain and mirroring requests (the order flips each round), one client."""
    times: dict[str, list[float]] = {"off": [], "on": []}
    with httpx.Client(timeout=10) as client:
        for i in range(requests):
            order = ("off", "on") if i % 2 == 0 else ("on", "off")
            for which in order:
                url = (setup.off if which == "off" else setup.on) + "/v1/chat/completions"
                started_at = time.perf_counter()
                client.post(url, json=chat(i)).raise_for_status()
                times[which].append(time.perf_counter() - started_at)
    off, on = times["off"][10:], times["on"][10:]  # the first few warm connections up
    return {
        "median_off_ms": statistics.median(off) * 1000,
        "median_on_ms": statistics.median(on) * 1000,
        "p99_off_ms": percentile(off, 0.99) * 1000,
        "p99_on_ms": percentile(on, 0.99) * 1000,
        "median_ratio": statistics.median(on) / statistics.median(off),
        "p99_ratio": percentile(on, 0.99) / percentile(off, 0.99),
    }


async def _flood(url: str, bodies: list[dict[str, Any]], concurrency: int) -> None:
    """POST every body, `concurrency` keep-alive connections at once, each request in one
    write as a gateway sends it (a plain asyncio client: an HTTP library's own cost would
    be what is measured)."""
    host, port = url.removeprefix("http://").split(":")
    queue = iter(bodies)

    async def worker() -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            for body in queue:
                data = json.dumps(body).encode()
                # The category header a gateway sets: here the request's model names it.
                category = str(body.get("model", "")).encode()
                writer.write(
                    b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\n"
                    b"X-Canaryd-Category: %s\r\n"
                    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                    % (host.encode(), category, len(data), data)
                )
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
        finally:
            writer.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def bounds(setup: Setup, window_s: float, windows: int, categories: int) -> dict[str, Any]:
    """Mirrored requests of several categories through nginx for `windows` windows."""
    before = setup.report()
    n = 0
    deadline = time.monotonic() + windows * window_s
    while time.monotonic() < deadline:
        batch = [chat(n + i, f"category{(n + i) % categories}", "bounds") for i in range(200)]
        asyncio.run(_flood(setup.on, batch, 16))
        n += len(batch)
    time.sleep(2 * window_s)  # the last window closes, the drain takes it
    after = setup.report()
    new_windows = after["sampled_by_window"][len(before["sampled_by_window"]) :]
    taken = after["taken_by_window"][len(before["taken_by_window"]) :]
    return {
        "mirrored": n,
        "received": after["counts"]["received"] - before["counts"]["received"],
        "sampled": after["counts"]["sampled"] - before["counts"]["sampled"],
        "windows": len(new_windows),
        "max_sampled_per_window": max(new_windows, default=0),
        "max_sampled_per_category": max((max(t.values()) for t in taken), default=0),
        "full_windows_at_bound": sum(1 for w in new_windows if w == PER_MINUTE),
    }


def memory(setup: Setup, total: int, checkpoints: int = 5) -> list[tuple[int, int]]:
    """The sink's RSS after each share of `total` distinct requests (direct, 32 at once)."""
    points = [(0, setup.report()["rss_kb"])]
    step = total // checkpoints
    for k in range(checkpoints):
        bodies = [chat(k * step + i, f"category{i % 8}", "memory") for i in range(step)]
        asyncio.run(_flood(setup.sink, bodies, 32))
        points.append(((k + 1) * step, setup.report()["rss_kb"]))
    return points


def run(args: argparse.Namespace) -> dict[str, Any]:
    nginx = shutil.which("nginx") or (
        "/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None
    )
    if nginx is None:
        raise SystemExit("nginx is not installed: bash .ci/services.sh installs Debian's package")
    with started(nginx, args.upstream_delay_ms / 1000, args.window_s) as setup:
        figures: dict[str, Any] = {"latency": latency(setup, args.requests)}
        figures["bounds"] = bounds(setup, args.window_s, args.windows, args.categories)
        figures["rss_kb"] = memory(setup, args.rss_requests)
        figures["counts"] = setup.report()["counts"]
    return figures


def show(figures: dict[str, Any], args: argparse.Namespace) -> None:
    lat, bnd, rss = figures["latency"], figures["bounds"], figures["rss_kb"]
    delay = args.upstream_delay_ms
    print(f"nginx mirror to canaryd's sink; the production stand-in answers after {delay:g} ms")
    print(
        f"latency ({args.requests} requests each, interleaved): median off "
        f"{lat['median_off_ms']:.2f} ms, on {lat['median_on_ms']:.2f} ms, ratio "
        f"{lat['median_ratio']:.3f} (goal <= 1.02); p99 off {lat['p99_off_ms']:.2f} ms, on "
        f"{lat['p99_on_ms']:.2f} ms, ratio {lat['p99_ratio']:.3f}"
    )
    print(
        f"bounds ({bnd['mirrored']} mirrored over {bnd['windows']} windows of {args.window_s:g} s, "
        f"{args.categories} categories): received {bnd['received']}, sampled {bnd['sampled']}; "
        f"largest per window {bnd['max_sampled_per_window']} (bound {PER_MINUTE}), per category "
        f"{bnd['max_sampled_per_category']} (bound {PER_CATEGORY}); windows at the bound "
        f"{bnd['full_windows_at_bound']}"
    )
    print("sink RSS: " + ", ".join(f"{n:,} req {kb / 1024:.1f} MiB" for n, kb in rss))
    growth = (rss[-1][1] - rss[len(rss) // 2][1]) / 1024
    print(f"RSS growth over the second half: {growth:+.1f} MiB")
    print("counts: " + json.dumps(figures["counts"], sort_keys=True))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=1500, help="latency requests per port")
    parser.add_argument("--rss-requests", type=int, default=100_000)
    parser.add_argument("--upstream-delay-ms", type=float, default=5.0)
    parser.add_argument("--window-s", type=float, default=1.0, help="the sampling window")
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--categories", type=int, default=4)
    parser.add_argument("--tiny", action="store_true", help="a few seconds: for the test")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-sink", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.tiny:
        args.requests, args.rss_requests, args.windows = 30, 1000, 2
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.serve_upstream is not None:
        serve_upstream(args.serve_upstream, args.upstream_delay_ms / 1000)
        return 0
    if args.serve_sink is not None:
        serve_sink(args.serve_sink, args.window_s)
        return 0
    figures = run(args)
    if args.json:
        print(json.dumps(figures, sort_keys=True))
    else:
        show(figures, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
