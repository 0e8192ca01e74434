"""A real nginx (Debian's package) on loopback for tests: its own prefix directory, config,
pid file and logs under a test's temp directory, in the foreground so the test owns it.

`Nginx.start(prefix, http_block)` writes `nginx.conf` around the `http { … }` body the
test gives, starts the master and waits (bounded) until it answers on its port; `reload`
is what an operator's hook runs (`nginx -s reload` against this prefix); `stop` ends it.
Tests that need it skip when the binary is missing (`services.sh` installs it in CI).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

START_WAIT_S = 15.0


def nginx_binary() -> str:
    """The nginx executable, or a skip when this machine has none."""
    found = shutil.which("nginx") or (
        "/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None
    )
    if found is None:
        pytest.skip("nginx is not installed (bash .ci/services.sh installs Debian's package)")
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Nginx:
    """One nginx master under `prefix`, listening on 127.0.0.1:`port`."""

    binary: str
    prefix: Path
    port: int
    process: subprocess.Popen[bytes]

    @property
    def conf(self) -> Path:
        return self.prefix / "nginx.conf"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def reload_command(self) -> str:
        """The line a hook runs to reload this nginx (`nginx -s reload` for this prefix)."""
        return f"{self.binary} -p {self.prefix}/ -c {self.conf} -s reload"

    @classmethod
    def start(cls, prefix: Path, http_block: str, port: int | None = None) -> Nginx:
        """Write the config around `http_block` (which must `listen` on `{port}`, filled in
        here) and start nginx; the caller must `stop` it."""
        binary = nginx_binary()
        port = port or free_port()
        (prefix / "logs").mkdir(parents=True, exist_ok=True)
        # As root, workers run as this user: root keeps them able to use the temp paths
        # under a test's private directory (pytest's are mode 0700).
        user = "user root;\n" if os.geteuid() == 0 else ""
        (prefix / "nginx.conf").write_text(
            f"{user}worker_processes 1;\n"
            f"pid {prefix}/nginx.pid;\n"
            f"error_log {prefix}/logs/error.log warn;\n"
            "events { worker_connections 256; }\n"
            "http {\n"
            f"    access_log off;\n"
            f"    client_body_temp_path {prefix}/client_body;\n"
            f"    proxy_temp_path {prefix}/proxy;\n"
            f"    fastcgi_temp_path {prefix}/fastcgi;\n"
            f"    uwsgi_temp_path {prefix}/uwsgi;\n"
            f"    scgi_temp_path {prefix}/scgi;\n"
            + http_block.replace("{port}", str(port))
            + "\n}\n",
            encoding="utf-8",
        )
        test = subprocess.run(
            [binary, "-t", "-p", f"{prefix}/", "-c", str(prefix / "nginx.conf")],
            capture_output=True,
            text=True,
            check=False,
        )
        assert test.returncode == 0, test.stderr
        process = subprocess.Popen(
            [binary, "-p", f"{prefix}/", "-c", str(prefix / "nginx.conf"), "-g", "daemon off;"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        server = cls(binary, prefix, port, process)
        deadline = time.monotonic() + START_WAIT_S
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise AssertionError(f"nginx exited: {server.log()}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return server
            except OSError:
                time.sleep(0.05)
        server.stop()
        raise AssertionError(f"nginx did not listen on {port} within {START_WAIT_S}s")

    def log(self) -> str:
        path = self.prefix / "logs" / "error.log"
        return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.process.stderr is not None:
            self.process.stderr.close()


def wait_for(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Call `check()` until it returns true or `timeout_s` passes (nginx's reload swaps
    its workers asynchronously: a request right after the signal may meet an old one)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout_s}s: {check}")
        time.sleep(0.05)


def get(url: str, **kwargs: object) -> httpx.Response:
    """One request on a new connection (a kept-alive one could stay with an old worker)."""
    with httpx.Client(timeout=5.0) as client:
        return client.get(url, **kwargs)  # type: ignore[arg-type]
