"""The router recipe of docs/switch.md with a real nginx: requests are routed by their
category header to the speculative upstream only while canaryd's switch says so, the
map rendered by `canaryd switch nginx-map` as the switch's command hook, which reloads
nginx on each generation."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from canaryd.cli.app import app
from tests.support.nginx import Nginx, get, nginx_binary, wait_for

pytestmark = pytest.mark.slow  # each switch command runs the hook, a fresh `canaryd` process
HEADER = "X-Canaryd-Category"


class _Named(BaseHTTPRequestHandler):
    """Answers every GET with the name of the server it belongs to."""

    def do_GET(self) -> None:
        body = json.dumps({"served_by": self.server.name}).encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def upstreams() -> Iterator[dict[str, int]]:
    """A baseline and a speculative server on loopback, by name → port."""
    servers = {}
    for name in ("baseline", "speculative"):
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Named)
        server.name = name  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers[name] = server
    yield {name: server.server_address[1] for name, server in servers.items()}
    for server in servers.values():
        server.shutdown()
        server.server_close()


def served_by(router: Nginx, category: str | None) -> str:
    headers = {HEADER: category} if category else {}
    answer = get(router.url + "/v1/models", headers=headers)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["served_by"])


def routed(router: Nginx, expected: dict[str | None, str]) -> bool:
    return all(served_by(router, category) == name for category, name in expected.items())


class TestNginxRoutesBySwitch:
    def test_requests_follow_the_switch_through_rollbacks(
        self, tmp_path: Path, upstreams: dict[str, int]
    ) -> None:
        """With no confirmed state every request goes to the baseline; after a restore
        each category goes to the speculative server; a category's rollback sends only
        that category back; the master's rollback sends everything back."""
        nginx_binary()
        database_url = f"sqlite:///{tmp_path / 'canaryd.db'}"
        map_file = tmp_path / "nginx" / "canaryd-routes.conf"
        state_file = tmp_path / "switch.json"
        prefix = tmp_path / "nginx"
        prefix.mkdir()
        runner = CliRunner()
        env = {"CANARYD_CONFIG": ""}
        first = runner.invoke(
            app,
            ["switch", "nginx-map", "--out", str(map_file), "--state-file", str(state_file)],
            env=env,
        )
        assert first.exit_code == 0, first.output
        assert "no readable state file: speculation off" in first.output
        router = Nginx.start(
            prefix,
            f"""
    upstream baseline {{ server 127.0.0.1:{upstreams["baseline"]}; }}
    upstream speculative {{ server 127.0.0.1:{upstreams["speculative"]}; }}
    include {map_file};
    server {{
        listen 127.0.0.1:{{port}};
        location / {{ proxy_pass http://$canaryd_upstream; }}
    }}""",
        )
        try:
            assert routed(router, {None: "baseline", "code": "baseline", "chat": "baseline"})
            hook = [
                sys.executable, "-m", "canaryd", "switch", "nginx-map",
                "--out", str(map_file), "--reload-command", router.reload_command,
            ]  # fmt: skip
            config = tmp_path / "canaryd.toml"
            config.write_text(
                f'[storage]\nurl = "{database_url}"\n'
                f'[switch]\nstate_file = "{state_file}"\n'
                f"[switch.command]\nargv = {json.dumps(hook)}\ntimeout_s = 300\nretries = 0\n",
                encoding="utf-8",
            )
            cli = ["-c", str(config)]
            assert runner.invoke(app, ["db", "upgrade", *cli], env=env).exit_code == 0

            def switch(*args: str) -> None:
                result = runner.invoke(app, ["switch", *args, *cli], env=env)
                assert result.exit_code == 0, result.output

            switch("rollback", "--reason", "deploy starts off")
            switch("restore", "--reason", "canary passed", "--force")
            wait_for(
                lambda: routed(
                    router, {None: "speculative", "code": "speculative", "chat": "speculative"}
                )
            )
            switch("rollback", "--category", "code", "--reason", "code regressed")
            wait_for(
                lambda: routed(
                    router, {None: "speculative", "code": "baseline", "chat": "speculative"}
                )
            )
            assert '"code" baseline;' in map_file.read_text()
            switch("rollback", "--reason", "pager")
            wait_for(
                lambda: routed(router, {None: "baseline", "code": "baseline", "chat": "baseline"})
            )
        finally:
            router.stop()
        assert "[emerg]" not in router.log()
