"""The slim install's boundary, without building a second venv: in a subprocess where the
`local` extra's packages (torch, transformers, accelerate, gguf, safetensors), the `report`
extra's matplotlib and the stack canaryd dropped (evaluate, datasets, pyarrow, pandas,
nltk) cannot be imported — a meta-path blocker installed by a `sitecustomize` on
PYTHONPATH, which also records every attempt — `canaryd judge` decides on two loopback
OpenAI-compatible arms and `canaryd switch status` reads the switch, neither trying to
import a blocked package; `canaryd report` writes its tables with a note naming the
`report` extra instead of plots; an in-process engine there fails with one line naming the
extra to install. And the runtime lock that installs it: the core's dependencies, every pin
with its hashes, at the dev lock's versions, none of the blocked packages.
(benchmarks/slim_install.py builds the real venv, measures it and runs `judge` and `run` in
it: minutes, so not here.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.configs import LIVENESS_ONLY
from tests.support.servers import MisbehavingServer

REPO_ROOT = Path(__file__).resolve().parents[2]
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", re.MULTILINE)
BLOCKED = (
    "torch",
    "transformers",
    "accelerate",
    "gguf",
    "safetensors",
    "evaluate",
    "datasets",
    "pyarrow",
    "pandas",
    "nltk",
    "matplotlib",
)
SITECUSTOMIZE = f"""
import os
import sys

_BLOCKED = {BLOCKED!r}
_LOG = os.environ["SLIM_BLOCKER_LOG"]


class _Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in _BLOCKED:
            with open(_LOG, "a", encoding="utf-8") as log:
                log.write(name + "\\n")
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, _Blocker())
"""


@pytest.fixture
def slim(tmp_path: Path) -> Iterator[tuple[dict[str, str], Path]]:
    """An environment whose interpreters cannot import the blocked packages, and the log
    of their attempts."""
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    log = tmp_path / "attempts.log"
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CANARYD_")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(blocker), str(REPO_ROOT)]),
        SLIM_BLOCKER_LOG=str(log),
        CANARYD_DATA_DIR=str(tmp_path / "data"),
        CANARYD_CONFIG="",
        COLUMNS="200",
    )
    yield env, log


def canaryd(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "canaryd", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def attempts(log: Path) -> list[str]:
    return log.read_text(encoding="utf-8").split() if log.exists() else []


class TestSlimInstall:
    def test_the_blocker_blocks(self, slim: tuple[dict[str, str], Path]) -> None:
        """The harness itself: importing torch under it fails and is recorded."""
        env, log = slim
        done = subprocess.run(
            [sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True
        )
        assert done.returncode == 1 and "No module named 'torch'" in done.stderr
        assert attempts(log) == ["torch"]

    def test_judge_on_remote_arms(self, slim: tuple[dict[str, str], Path], tmp_path: Path) -> None:
        """`canaryd judge` PASSes a healthy candidate and imports nothing blocked."""
        env, log = slim
        config = tmp_path / "judge.toml"
        config.write_text(
            LIVENESS_ONLY + f'[storage]\nurl = "sqlite:///{tmp_path / "judge.db"}"\n',
            encoding="utf-8",
        )
        with MisbehavingServer() as baseline, MisbehavingServer() as candidate:
            done = canaryd(
                env, "judge", "--config", str(config), "--baseline", baseline.url,
                "--candidate", candidate.url, "--pairs", "20", "--model", "m",
            )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert "verdict: PASS" in done.stdout
        assert attempts(log) == []

    def test_report_without_plots(self, slim: tuple[dict[str, str], Path], tmp_path: Path) -> None:
        """`canaryd report` on a judged run writes the HTML and the tables, and says that
        the plots need `canaryd-specdec[report]` instead of failing."""
        env, log = slim
        url = f"sqlite:///{tmp_path / 'judge.db'}"
        config = tmp_path / "judge.toml"
        config.write_text(LIVENESS_ONLY + f'[storage]\nurl = "{url}"\n', encoding="utf-8")
        with MisbehavingServer() as baseline, MisbehavingServer() as candidate:
            judged = canaryd(
                env, "judge", "--config", str(config), "--baseline", baseline.url,
                "--candidate", candidate.url, "--pairs", "5", "--model", "m",
            )  # fmt: skip
        assert judged.returncode in (0, 3), judged.stdout + judged.stderr
        out = tmp_path / "report.html"
        done = canaryd(env, "report", "--url", url, "--out", str(out))
        assert done.returncode == 0, done.stdout + done.stderr
        assert "plots left out: the report's plots need 'matplotlib'" in done.stdout
        assert "pip install 'canaryd-specdec[report]'" in done.stdout
        assert f"wrote {out} (0 plots)" in done.stdout
        assert "<table" in out.read_text(encoding="utf-8")
        assert set(attempts(log)) <= {"matplotlib", "matplotlib.figure"}

    def test_switch_status(self, slim: tuple[dict[str, str], Path], tmp_path: Path) -> None:
        """`canaryd db upgrade` and `canaryd switch status` work and import nothing blocked."""
        env, log = slim
        url = f"sqlite:///{tmp_path / 'switch.db'}"
        env = {**env, "CANARYD_SWITCH__STATE_FILE": str(tmp_path / "switch.json")}
        upgraded = canaryd(env, "db", "upgrade", "--url", url)
        assert upgraded.returncode == 0, upgraded.stderr
        status = canaryd(env, "switch", "status", "--url", url)
        assert status.returncode == 0, status.stderr
        assert "mode: auto (speculative decoding ENABLED)" in status.stdout
        assert attempts(log) == []

    def test_in_process_engine_names_the_extra(self, slim: tuple[dict[str, str], Path]) -> None:
        """The default arms (the embedded model in-process) fail with one line naming
        `canaryd-specdec[local]`, not a traceback."""
        env, _ = slim
        done = canaryd(env, "once", "--pairs", "1")
        assert done.returncode == 2, done.stdout + done.stderr
        assert "Traceback" not in done.stderr
        assert 'kind = "transformers" (the in-process engine) needs' in done.stderr
        assert "install canaryd-specdec[local]" in done.stderr


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(lock: str) -> dict[str, str]:
    text = (REPO_ROOT / lock).read_text(encoding="utf-8")
    return {normalized(name): version for name, version in _PIN.findall(text)}


class TestRuntimeLock:
    def test_pins_the_core_at_the_dev_locks_versions(self) -> None:
        """Each of pyproject's core dependencies is pinned, and every pin is the version
        `make venv` installs and tests (requirements.lock)."""
        project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
        core = {normalized(re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0])
                for d in project["project"]["dependencies"]}  # fmt: skip
        runtime, dev = pins("requirements-runtime.lock"), pins("requirements.lock")
        assert core <= set(runtime), core - set(runtime)
        assert {n: v for n, v in runtime.items() if dev.get(n) != v} == {}

    def test_every_pin_has_hashes_and_nothing_blocked(self) -> None:
        """`pip install --require-hashes` accepts it (a hash under every pin), and it
        carries none of the packages the slim install leaves out."""
        text = (REPO_ROOT / "requirements-runtime.lock").read_text(encoding="utf-8")
        entries = re.split(r"^(?=[A-Za-z0-9])", text, flags=re.MULTILINE)[1:]
        assert len(entries) == len(pins("requirements-runtime.lock")) > 20
        assert [e.split()[0] for e in entries if "--hash=sha256:" not in e] == []
        assert set(pins("requirements-runtime.lock")) & {*BLOCKED, "psycopg"} == set()
