"""canaryd's HTTP engine against a bare httpx streaming loop on the same server.

Both clients send the same streamed chat request to the same OpenAI-compatible server
and read it to `[DONE]`; runs are interleaved so machine noise hits both alike.
Reported: overhead ratio = median OpenAIEngine.generate time / median bare-loop time
(the engine's extra cost: its event-loop hop, chunk parsing, result building).

The server is the test suite's loopback server by default (`tests.support.servers`: a
stream of `--tokens` chunks `--token-delay` apart), or any server given with `--base-url`
(e.g. a llama.cpp server). `tests` is importable because `make venv` installs canaryd in
editable mode, which puts the repository root on the path.

Usage: .venv/bin/python benchmarks/http_overhead.py [--requests 200] [--tokens 64]
       [--token-delay 0.0] [--base-url http://127.0.0.1:8000 --model NAME]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import ExitStack

import httpx

from engine.config import OpenAIEngineConfig
from engine.http import OpenAIEngine
from engine.types import GenerationRequest, Message, SamplingParams
from tests.support.servers import Behaviour, MisbehavingServer

PROMPT = "Write one short sentence about canaries."


def bare_loop(client: httpx.Client, body: dict[str, object]) -> tuple[float, int]:
    """The least a client can do: stream, split SSE lines, json-decode each chunk."""
    started = time.perf_counter()
    chunks = 0
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data:"):
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                json.loads(data)
                chunks += 1
    return time.perf_counter() - started, chunks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--token-delay", type=float, default=0.0)
    parser.add_argument("--base-url", default=None)
    parser.add_argument("--model", default="default")
    args = parser.parse_args()

    with ExitStack() as stack:
        if args.base_url is None:
            server = stack.enter_context(MisbehavingServer())
            base_url = server.url
            server.default = Behaviour(tokens=args.tokens, token_delay_s=args.token_delay)
        else:
            base_url = args.base_url
        engine = OpenAIEngine(OpenAIEngineConfig(base_url=base_url, model=args.model))
        stack.callback(engine.close)
        client = stack.enter_context(httpx.Client(base_url=base_url, timeout=60.0))
        request = GenerationRequest(
            messages=(Message("user", PROMPT),),
            sampling=SamplingParams(max_tokens=args.tokens),
        )
        body: dict[str, object] = {
            "model": args.model,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": args.tokens,
            "temperature": 0.0,
            "top_p": 1.0,
            "seed": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        for _ in range(5):  # warm up connections and code paths
            engine.generate(request)
            bare_loop(client, body)
        engine_s: list[float] = []
        bare_s: list[float] = []
        for i in range(args.requests):
            order = (0, 1) if i % 2 == 0 else (1, 0)
            for which in order:
                if which == 0:
                    started = time.perf_counter()
                    result = engine.generate(request)
                    engine_s.append(time.perf_counter() - started)
                    if not result.ok:
                        raise SystemExit(f"engine failed: {result.error}: {result.error_detail}")
                else:
                    bare_s.append(bare_loop(client, body)[0])
    engine_median, bare_median = statistics.median(engine_s), statistics.median(bare_s)
    print(
        json.dumps(
            {
                "server": args.base_url or "tests.support.servers.MisbehavingServer",
                "requests": args.requests,
                "tokens": args.tokens,
                "engine_median_ms": round(engine_median * 1000, 3),
                "bare_httpx_median_ms": round(bare_median * 1000, 3),
                "overhead_ratio": round(engine_median / bare_median, 3),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
