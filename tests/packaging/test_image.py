"""The OCI image (Containerfile, `make image`): `canaryd run` starts inside it on fake arms
as a non-root user, listening on 0.0.0.0, and answers /readyz and /healthz 200 through a
published port; the kill switch runs in the same container; no compiler is in it.

Run by `make image-test`, which builds the image and names it in CANARYD_IMAGE; without
that variable (as in `make test`) the test is skipped: it needs a container runtime and
minutes. CANARYD_IMAGE_RUN=buildah-chroot runs the image's filesystem, user and
environment with `buildah run --isolation=chroot` in the host's network instead of
`podman run`, for hosts whose sandbox refuses an OCI runtime (setrlimit RLIMIT_NPROC
denied in a nested container); the port then comes from the environment, not a
published one."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

IMAGE = os.environ.get("CANARYD_IMAGE", "")
CONTAINER = os.environ.get("CONTAINER", "podman")
RUN_MODE = os.environ.get("CANARYD_IMAGE_RUN", "podman")
FAKE_ARMS = """
[arms.baseline]
kind = "fake"
[arms.speculative]
kind = "fake"
speculative = true
[prompts]
max_tokens = 8
[gates.budget]
over_design_rate = "rebudget"
[schedule]
pair_interval_s = 0.5
jitter_s = 0
[storage]
url = "sqlite:////var/lib/canaryd/canaryd.db"
[switch]
state_file = "/var/lib/canaryd/switch.json"
"""

pytestmark = pytest.mark.skipif(
    not IMAGE, reason="builds and runs the image: `make image-test` (CANARYD_IMAGE)"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def runtime(
    *args: str, timeout: float = 120, tool: str = CONTAINER
) -> subprocess.CompletedProcess[str]:
    binary = shutil.which(tool)
    assert binary, f"{tool} is not installed"
    return subprocess.run(
        [binary, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def get(url: str) -> tuple[int, dict[str, object]]:
    response = httpx.get(url, timeout=5)
    return response.status_code, response.json() if response.content else {}


class Running:
    """canaryd started from the image, and a way to run a command beside it."""

    def __init__(self, tmp_path: Path) -> None:
        config = tmp_path / "canaryd.toml"
        config.write_text(FAKE_ARMS)
        config.chmod(0o644)
        self.port = free_port()
        self.name = f"canaryd-test-{uuid.uuid4().hex[:8]}"
        self.process: subprocess.Popen[bytes] | None = None
        self.chroot_args: list[str] = []
        mount = f"{config}:/etc/canaryd/canaryd.toml:ro"
        if RUN_MODE == "buildah-chroot":
            made = runtime("from", "--name", self.name, IMAGE, tool="buildah")
            assert made.returncode == 0, made.stderr
            # `buildah run` mounts the image's VOLUME as a fresh anonymous volume over the
            # bind below, a different one each run: the daemon's database then lives where
            # the kill switch (a second run) cannot see it. Without the declaration the bind
            # is what each run sees, as under `podman run --volume`.
            unvolumed = runtime(
                "config", "--volume", "/var/lib/canaryd-", self.name, tool="buildah"
            )
            assert unvolumed.returncode == 0, unvolumed.stderr
            buildah = shutil.which("buildah")
            assert buildah
            (tmp_path / "data").mkdir()
            (tmp_path / "data").chmod(0o777)
            self.chroot_args = [
                "--isolation=chroot", "--user", "10001:10001", "--volume", mount,
                "--volume", f"{tmp_path / 'data'}:/var/lib/canaryd",
                "--env", f"CANARYD_SERVER__LISTEN=0.0.0.0:{self.port}",
            ]  # fmt: skip
            self.process = subprocess.Popen(
                [buildah, "run", *self.chroot_args, self.name, "--", *self.entrypoint()],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            return
        started = runtime(
            "run", "--detach", "--name", self.name, "--read-only", "--tmpfs", "/tmp",
            "--volume", mount, "--publish", f"127.0.0.1:{self.port}:9466", IMAGE,
        )  # fmt: skip
        assert started.returncode == 0, started.stderr

    @staticmethod
    def entrypoint() -> list[str]:
        inspected = runtime("image", "inspect", IMAGE)
        (image,) = json.loads(inspected.stdout)
        command: list[str] = image["Config"]["Entrypoint"]
        return command

    def running(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        state = runtime("inspect", "--format", "{{.State.Running}}", self.name)
        return state.stdout.strip() == "true"

    def exec(self, *argv: str) -> subprocess.CompletedProcess[str]:
        if self.process is not None:
            return runtime(
                "run", *self.chroot_args, self.name, "--", *argv, timeout=180, tool="buildah"
            )  # fmt: skip
        return runtime("exec", self.name, *argv, timeout=180)

    def stop(self) -> None:
        if self.process is not None:
            # The whole group: SIGTERM to `buildah run` alone leaves canaryd running.
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                out, _ = self.process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                out, _ = self.process.communicate()
            print(out.decode(errors="replace")[-4000:])
            runtime("rm", self.name, tool="buildah")
            return
        logs = runtime("logs", self.name)
        print(logs.stdout[-4000:], logs.stderr[-4000:])
        runtime("rm", "--force", self.name)


@pytest.fixture
def container(tmp_path: Path) -> Iterator[Running]:
    """The image running on fake arms, its config mounted read-only where canaryd looks;
    under podman its port 9466 published on a free loopback port, root filesystem
    read-only."""
    running = Running(tmp_path)
    try:
        yield running
    finally:
        running.stop()


def test_canaryd_runs_in_the_image_and_answers_its_probes(container: Running) -> None:
    port = container.port
    deadline = time.monotonic() + 180
    status: int | None = None
    body: dict[str, object] = {}
    while time.monotonic() < deadline:
        try:
            status, body = get(f"http://127.0.0.1:{port}/readyz")
        except (httpx.HTTPError, ValueError):
            status = None
        if status == 200:
            break
        assert container.running(), "canaryd exited"
        time.sleep(1)
    assert status == 200, body
    health_deadline = time.monotonic() + 60
    while (health := get(f"http://127.0.0.1:{port}/healthz"))[0] != 200:
        assert time.monotonic() < health_deadline, health
        time.sleep(1)
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert "canaryd_heartbeat_timestamp_seconds" in metrics

    # Non-root; the kill switch runs beside the daemon with the same config.
    uid = container.exec("id", "-u")
    assert uid.stdout.strip() == "10001", uid
    status_cmd = container.exec("canaryd", "switch", "status", "--json")
    assert status_cmd.returncode == 0, status_cmd.stdout + status_cmd.stderr
    # No compiler in the final image.
    compilers = container.exec("sh", "-c", "command -v gcc cc c++ clang || true")
    assert compilers.stdout.strip() == "", compilers.stdout


def test_the_image_declares_its_volume_user_and_entrypoint() -> None:
    inspected = runtime("image", "inspect", IMAGE)
    assert inspected.returncode == 0, inspected.stderr
    (image,) = json.loads(inspected.stdout)
    config = image["Config"]
    assert config["User"].split(":")[0] == "10001"
    assert "/var/lib/canaryd" in config["Volumes"]
    assert config["Entrypoint"][-2:] == ["canaryd", "run"]
    assert "9466/tcp" in config["ExposedPorts"]
    assert "CANARYD_SERVER__LISTEN=0.0.0.0:9466" in config["Env"]
    assert "CANARYD_DATA_DIR=/var/lib/canaryd" in config["Env"]
