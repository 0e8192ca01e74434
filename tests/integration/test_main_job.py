"""The main job as a user runs it: `python -m canaryd run` and `python -m canaryd once` in
fresh processes on the embedded default (no config file, their own data directory).

In the test process transformers is already imported, so an import-order or thread race at
start-up can only show in a fresh interpreter; these tests are that interpreter."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from benchmarks.demo_check import pairs as stored_pairs
from canaryd import paths
from engine.provision import require_embedded_model

pytestmark = [pytest.mark.model, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]

# Loaded by the interpreter before `canaryd` (PYTHONPATH): records every first import of a
# heavy library made by a thread other than the main one. Such imports race the main
# thread's (transformers' lazy module is not thread-safe on first import) and crash the
# start-up only now and then, so the test looks for the import itself, not the crash.
THREAD_IMPORT_RECORDER = """
import os, sys, threading
_HEAVY = ("transformers", "evaluate", "datasets", "torch", "huggingface_hub", "scipy")
_out = open(os.environ["CANARYD_TEST_THREAD_IMPORTS"], "a", buffering=1)
def _hook(event, args):
    if event == "import" and str(args[0]).split(".")[0] in _HEAVY:
        if threading.current_thread() is not threading.main_thread():
            _out.write(f"{threading.current_thread().name} {args[0]}\\n")
sys.addaudithook(_hook)
"""


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A data directory of its own that shares only the converted embedded model."""
    models = paths.models_dir()
    require_embedded_model(models)
    data = tmp_path / "data"
    data.mkdir()
    (data / "models").symlink_to(models.resolve(), target_is_directory=True)
    return data


def user_env(data: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CANARYD_")}
    env.update(CANARYD_DATA_DIR=str(data), HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", **extra)
    return env


def pairs_total(address: str) -> float:
    try:
        text = httpx.get(f"http://{address}/metrics", timeout=5).text
    except httpx.HTTPError:
        return 0.0
    return sum(float(m) for m in re.findall(r"^canaryd_pairs_total\{[^}]*\} (\S+)$", text, re.M))


@pytest.fixture
def daemon(data_dir: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    log = tmp_path / "run.log"
    recorder = tmp_path / "recorder"
    recorder.mkdir()
    (recorder / "sitecustomize.py").write_text(THREAD_IMPORT_RECORDER)
    env = user_env(
        data_dir,
        # The only override of the defaults: a free port, so that a daemon already on
        # :9466 cannot answer for this one.
        CANARYD_SERVER__LISTEN="127.0.0.1:0",
        CANARYD_TEST_THREAD_IMPORTS=str(tmp_path / "thread-imports.txt"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(recorder), os.environ.get("PYTHONPATH")])),
    )
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "canaryd", "run"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )
        try:
            yield process, log
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


class TestRunOnTheEmbeddedDefault:
    def test_stores_the_first_pair_exports_it_and_stops_cleanly_on_sigterm(
        self, daemon: tuple[subprocess.Popen[bytes], Path], data_dir: Path, tmp_path: Path
    ) -> None:
        """`canaryd run` with no config starts, stores a pair in its own SQLite database,
        counts it on /metrics, and exits 0 on SIGTERM; no thread but the main one
        imported a heavy library for the first time on the way."""
        process, log = daemon
        database = data_dir / "canaryd.db"
        address = None
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if process.poll() is not None:
                pytest.fail(f"canaryd run exited {process.returncode}:\n{log.read_text()[-4000:]}")
            if address is None:
                found = re.search(r"serving /metrics.* on http://(\S+) ", log.read_text())
                address = found.group(1) if found else None
            if address and stored_pairs(database) >= 1 and pairs_total(address) >= 1:
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"no pair stored and exported in 240 s:\n{log.read_text()[-4000:]}")
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0, log.read_text()[-4000:]
        assert "Traceback" not in log.read_text()
        imports = tmp_path / "thread-imports.txt"
        threaded = imports.read_text().splitlines() if imports.exists() else []
        assert threaded == [], f"first imports on other threads: {threaded[:10]}"


class TestOnceOnTheEmbeddedDefault:
    def test_prints_the_table_and_the_verdict_sentences(
        self, data_dir: Path, tmp_path: Path
    ) -> None:
        """`canaryd once` (the first step of `make demo`) runs in a fresh process, stores
        its pairs, and ends its table with plain sentences on where speculation paid off."""
        result = subprocess.run(
            [sys.executable, "-m", "canaryd", "once", "--pairs", "3"],
            cwd=tmp_path,
            env=user_env(data_dir, CANARYD_PROMPTS__MAX_TOKENS="32"),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert result.returncode == 0, result.stderr[-4000:]
        assert "canaryd once — run" in result.stdout
        words = " ".join(result.stdout.split())
        assert "its gates decide" in words
        assert "Speculation paid off on these pairs in" in words or "It did not in" in words
        assert stored_pairs(data_dir / "canaryd.db") == 3
