"""`canaryd probe` through the CLI runner against two loopback OpenAI-compatible servers
(tests.support.capability_server) whose capabilities break one by one: every capability
passes on healthy servers and fails when the speculative arm breaks it (exit 1), a
baseline that fails one is no regression (exit 0), refused features are unsupported,
bad input and unreachable servers are exit 2; the table is stored as a run of kind
`probe` and `canaryd report` draws it. Against hostile servers (tests.support.servers: a
stream that drips or never ends) the run ends by its deadline, every answer within its
byte cap, and the answers cut short are counted in the output."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from canaryd.cli.app import app
from canaryd.parity import checks
from canaryd.parity.checks import CAPABILITIES
from canaryd.parity.client import ANSWER_BYTES
from canaryd.store import SqlStore
from tests.support.capability_server import CapabilityServer
from tests.support.servers import Behaviour, MisbehavingServer, refused_url

NAMES = (
    "streaming_equals_plain", "stop", "max_tokens_1", "logprobs", "n_gt_1",
    "seed_reproducible", "json_schema", "long_context", "over_limit_4xx", "odd_input",
    "burst_16", "cancel_mid_stream",
)  # fmt: skip
# How far past its deadline (and one drip) a cut run may end: a loaded 2-core CI machine's
# scheduling noise. A run the deadline did not cut would go on for minutes.
SLACK_S = 2.0
# What the speculative arm's reason says when it breaks each capability.
FAILS_WITH = {
    "streaming_equals_plain": "greedy streamed and plain answers differ at character",
    "stop": "the answer runs past the stop string",
    "max_tokens_1": "3 tokens answered for max_tokens = 1",
    "logprobs": "no logprobs in the answer",
    "n_gt_1": "choice 1: implausible token (NLL 15.0 nats > 12 under the baseline model)",
    "seed_reproducible": "the same seeded request at T=0.9, request 2: answers differ at",
    "json_schema": "not JSON",
    "long_context": "HTTP 500",
    "over_limit_4xx": "answered 200 to a prompt over the 600-token limit",
    "odd_input": "empty: HTTP 500: internal error: empty input",
    "burst_16": "of 16 failed, first: HTTP 503: overloaded",
    "cancel_mid_stream": "cancelled streams still generating",
}


@pytest.fixture
def database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CANARYD_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("CANARYD_CONFIG", "")
    monkeypatch.delenv("CANARYD_DATABASE_URL", raising=False)
    db = tmp_path / "probe.db"
    monkeypatch.setenv("CANARYD_STORAGE__URL", f"sqlite:///{db}")
    # A leaked running request is judged after this long (15 s in production).
    monkeypatch.setattr(checks, "GAUGE_SETTLE_S", 1.0)
    return db


def probe(
    baseline: CapabilityServer, candidate: CapabilityServer | MisbehavingServer, *args: str
) -> tuple[int, str]:
    result = CliRunner().invoke(
        app,
        [
            "probe", "--baseline", baseline.url, "--candidate", candidate.url,
            "--model", "probe-model", "--server-kind", "vllm", *args,
        ],
    )  # fmt: skip
    return result.exit_code, result.output


def table(output: str) -> dict[str, dict[str, Any]]:
    body = json.loads(output)
    assert [c["name"] for c in body["capabilities"]] == list(NAMES)
    for capability in body["capabilities"]:
        assert set(capability) == {"name", "baseline", "speculative"}
        for arm in ("baseline", "speculative"):
            assert set(capability[arm]) == {"state", "reason"}
            assert capability[arm]["state"] in ("pass", "fail", "unsupported")
    return {c["name"]: c for c in body["capabilities"]}


class TestProbe:
    def test_the_capability_names_are_the_contract(self) -> None:
        """The checklist's names and order are the documented JSON contract."""
        assert CAPABILITIES == NAMES

    def test_healthy_servers_pass_everything(self, database: Path) -> None:
        """Two healthy servers: every capability passes on both arms, exit 0; the table
        is stored as a run of kind `probe`."""
        with CapabilityServer() as baseline, CapabilityServer() as candidate:
            code, output = probe(baseline, candidate, "--json")
        assert code == 0, output
        rows = table(output)
        for name, row in rows.items():
            for arm in ("baseline", "speculative"):
                assert row[arm]["state"] == "pass", (name, arm, row[arm]["reason"])
        assert "NLL 1.0 nats under the baseline model" in rows["n_gt_1"]["speculative"]["reason"]
        assert rows["cancel_mid_stream"]["speculative"]["reason"].endswith("gauge back to 0")
        body = json.loads(output)
        assert body["regressions"] == [] and body["context_limit"] == 600
        with SqlStore.open(f"sqlite:///{database}") as store:
            [run] = store.runs()
        assert run.info.kind == "probe" and run.info.run_id == body["run_id"]
        assert run.info.config["probe"]["capabilities"] == body["capabilities"]

    def test_a_speculative_arm_that_breaks_every_capability_regresses_on_each(
        self, database: Path
    ) -> None:
        """Each capability broken on the speculative arm fails there with its reason,
        passes on the baseline, and is a regression: exit 1."""
        with CapabilityServer() as baseline, CapabilityServer(broken=NAMES) as candidate:
            code, output = probe(baseline, candidate, "--json")
        assert code == 1, output
        rows = table(output)
        for name, says in FAILS_WITH.items():
            assert rows[name]["baseline"]["state"] == "pass", (name, rows[name]["baseline"])
            assert rows[name]["speculative"]["state"] == "fail", (name, rows[name])
            assert says in rows[name]["speculative"]["reason"], (name, rows[name])
        assert json.loads(output)["regressions"] == list(NAMES)

    def test_what_the_baseline_fails_too_is_no_regression(self, database: Path) -> None:
        """A baseline that ignores seeds and a speculative arm that honours them: the
        baseline fails, the speculative arm passes, exit 0 (nothing regressed)."""
        broken = ["seed_reproducible"]
        with CapabilityServer(broken=broken) as baseline, CapabilityServer() as candidate:
            code, output = probe(baseline, candidate, "--json")
        assert code == 0, output
        row = table(output)["seed_reproducible"]
        assert (row["baseline"]["state"], row["speculative"]["state"]) == ("fail", "pass")

    def test_refused_features_are_unsupported_and_a_regression(self, database: Path) -> None:
        """A speculative server that answers 400 to logprobs, n > 1 and response_format:
        those are unsupported with the server's words — a regression all the same."""
        refused = ("logprobs", "n", "response_format")
        with CapabilityServer() as baseline, CapabilityServer(unsupported=refused) as candidate:
            code, output = probe(baseline, candidate, "--json")
        assert code == 1, output
        rows = table(output)
        for name in ("logprobs", "n_gt_1", "json_schema"):
            assert rows[name]["speculative"]["state"] == "unsupported", rows[name]
            assert "HTTP 400: " in rows[name]["speculative"]["reason"]
            assert "not supported with speculative decoding" in rows[name]["speculative"]["reason"]
        assert json.loads(output)["regressions"] == ["logprobs", "n_gt_1", "json_schema"]

    def test_the_table_and_the_report(self, database: Path, tmp_path: Path) -> None:
        """Without --json: the capability × arm table and the regression line; `canaryd
        report --run ID` draws the same table."""
        with CapabilityServer() as baseline, CapabilityServer(broken=["stop"]) as candidate:
            code, output = probe(baseline, candidate)
        assert code == 1, output
        assert "canaryd probe — run" in output and "streaming_equals_plain" in output
        assert "REGRESSION on stop;" in output
        run_id = output.split("canaryd report --run ")[1].split("`")[0]
        result = CliRunner().invoke(
            app, ["report", "--run", run_id, "--out", str(tmp_path / "r.html")]
        )
        assert result.exit_code == 0, result.output
        assert f"### Capability parity (probe run {run_id})" in result.output
        assert "regressions: stop" in result.output
        assert "| stop | pass: stopped before" in result.output
        assert "Capability parity" in (tmp_path / "r.html").read_text()


class TestProbeAgainstHostileServers:
    def test_a_dripping_candidate_is_cut_at_the_deadline(self, database: Path) -> None:
        """A candidate that answers its first request, then drips one byte every 0.5 s:
        the run ends within `--timeout 4` (plus one drip); the capability the drip held
        fails with the deadline as its reason (a regression, exit 1), the rest are not
        run, and the output counts the answer cut short."""
        with CapabilityServer() as baseline, MisbehavingServer() as candidate:
            candidate.queue(Behaviour())  # the short generation, before the checklist
            candidate.default = Behaviour(fault="drip", drip_s=0.5)
            started = time.monotonic()
            code, output = probe(baseline, candidate, "--json", "--timeout", "4")
            wall_s = time.monotonic() - started
        assert code == 1, output
        assert wall_s < 4 + 8, wall_s  # the deadline, one drip, and the command's start
        body, rows = json.loads(output), table(output)
        assert body["elapsed_s"] < 4 + 0.5 + SLACK_S  # the deadline and one drip
        assert body["regressions"] == ["streaming_equals_plain"]
        assert body["not_run"] == list(NAMES[1:])
        assert body["read_caps"] == {"probe_deadline": 1}
        reason = rows["streaming_equals_plain"]["speculative"]["reason"]
        # The answer's budget is what the run's deadline had left when it was asked
        # (about 3.9 s; less on a loaded machine), shown to 3 significant digits ("3").
        budget = re.fullmatch(
            r"no whole answer within (\d+(?:\.\d+)?) s \(the probe's deadline; \d+ bytes "
            r"read\): connection closed",
            reason,
        )
        assert budget is not None, reason
        assert 0 < float(budget.group(1)) < 4, reason
        assert rows["stop"]["baseline"]["reason"] == "not run: the probe's 4 s deadline had passed"

    def test_a_run_cut_before_any_capability_shows_no_parity(self, database: Path) -> None:
        """A candidate that drips from its first request: the deadline passes before the
        checklist starts, every capability is not run, and no parity is claimed: exit 2
        with the table, the capabilities not run and the generation cut short."""
        with CapabilityServer() as baseline, MisbehavingServer() as candidate:
            candidate.default = Behaviour(fault="drip", drip_s=0.5)
            code, output = probe(baseline, candidate, "--timeout", "3")
        assert code == 2, output
        flat = " ".join(output.split())
        assert f"INCOMPLETE: the deadline passed before {', '.join(NAMES)} ran;" in flat
        assert "answers cut short by a read cap: probe_deadline 1" in flat
        elapsed = float(re.findall(r" ran; ([\d.]+) s; `canaryd report", flat)[0])
        assert elapsed < 3 + SLACK_S

    @pytest.mark.timeout(120)
    def test_an_endless_candidate_is_cut_at_the_byte_cap(self, database: Path) -> None:
        """A candidate streaming well-formed content for ever (~30 MB/s) to every
        request: each answer is cut at `ANSWER_BYTES` (each generation at its own cap),
        so every capability fails naming the cap and the bytes it kept, exit 1, within
        seconds; the output counts the cut answers."""
        with CapabilityServer() as baseline, MisbehavingServer() as candidate:
            candidate.default = Behaviour(fault="endless", token_delay_s=0.002)
            started = time.monotonic()
            code, output = probe(baseline, candidate, "--json")
            wall_s = time.monotonic() - started
        assert code == 1, output
        assert wall_s < 60, wall_s
        body, rows = json.loads(output), table(output)
        assert body["regressions"] == list(NAMES) and body["not_run"] == []
        for name, row in rows.items():
            assert row["speculative"]["state"] == "fail", (name, row)
            assert "byte cap" in row["speculative"]["reason"], (name, row)
        kept = [int(n) for n in re.findall(r"\((\d+) bytes read\)", output)]
        assert kept and max(kept) <= ANSWER_BYTES + 128 * 1024
        assert (
            "invalid_output: output over its byte cap"
            in rows["long_context"]["speculative"]["reason"]
        )
        caps = body["read_caps"]
        # Every answer the candidate began: the shared greedy one, one of each of nine
        # checks, the burst of 16 (the cancelled streams are dropped at their first token).
        assert caps["probe_answer_bytes"] == 10 + 16 and caps["generation_bytes"] == 2
        assert "probe_deadline" not in caps


class TestProbeErrors:
    @pytest.mark.parametrize(
        ("args", "says"),
        [
            (
                ["--baseline", "http://127.0.0.1:9"],
                "give both --baseline and --candidate, or neither (arms from --config)",
            ),
            (
                ["--baseline", "127.0.0.1:9", "--candidate", "http://127.0.0.1:9"],
                "--baseline '127.0.0.1:9': expected an http:// or https:// URL (no /v1)",
            ),
            (
                [],
                'probe: arms.baseline: kind = "transformers": the probe asks servers, '
                'set kind = "openai" (or give --baseline and --candidate URLs)',
            ),
        ],
    )
    def test_bad_input_is_exit_2_with_one_line(
        self, database: Path, args: list[str], says: str
    ) -> None:
        """A usage problem is exit 2 and one `canaryd: error:` line naming the option or
        the arm's key."""
        result = CliRunner().invoke(app, ["probe", *args])
        assert result.exit_code == 2, result.output
        assert result.output.strip().splitlines() == [f"canaryd: error: {says}"]

    def test_an_empty_greedy_answer_is_named_not_ok(self, database: Path) -> None:
        """A baseline that answers 200 with no text stops the probe with one line saying
        so (not "failed: ok")."""
        with MisbehavingServer() as baseline, CapabilityServer() as candidate:
            baseline.default = Behaviour(piece="")
            result = CliRunner().invoke(
                app, ["probe", "--baseline", baseline.url, "--candidate", candidate.url]
            )
        assert result.exit_code == 2, result.output
        assert result.output.strip() == (
            "canaryd: error: probe: arms.baseline: the plain greedy request came back with no text"
        )

    def test_an_unreachable_server_is_exit_2(self, database: Path) -> None:
        """A candidate nobody listens on: exit 2 naming the arm, nothing stored."""
        url = refused_url()
        with CapabilityServer() as baseline:
            result = CliRunner().invoke(
                app, ["probe", "--baseline", baseline.url, "--candidate", url]
            )
        assert result.exit_code == 2, result.output
        assert result.output.startswith(
            f"canaryd: error: probe: arms.speculative: {url} does not answer: ConnectError"
        )
        assert not database.exists() or not SqlStore.open(f"sqlite:///{database}").runs()


@pytest.mark.slow  # a `canaryd probe` subprocess
class TestProbeAsAUserRunsIt:
    def test_a_subprocess_prints_the_json_and_exits_1_on_a_regression(self, tmp_path: Path) -> None:
        """`python -m canaryd probe --json` in its own process, as a CI job runs it: the
        JSON on stdout, nothing else there, exit 1 for a speculative arm ignoring seeds."""
        env = {
            **os.environ,
            "CANARYD_DATA_DIR": str(tmp_path / "data"),
            "CANARYD_CONFIG": "",
            "CANARYD_STORAGE__URL": f"sqlite:///{tmp_path / 'probe.db'}",
        }
        env.pop("CANARYD_DATABASE_URL", None)
        broken = ["seed_reproducible"]
        with CapabilityServer() as baseline, CapabilityServer(broken=broken) as candidate:
            result = subprocess.run(
                [
                    sys.executable, "-m", "canaryd", "probe", "--json",
                    "--baseline", baseline.url, "--candidate", candidate.url,
                    "--model", "probe-model",
                ],
                capture_output=True, text=True, env=env, timeout=120, check=False,
            )  # fmt: skip
        assert result.returncode == 1, result.stderr
        rows = table(result.stdout)
        assert json.loads(result.stdout)["regressions"] == ["seed_reproducible"]
        # --server-kind generic: the baseline cannot score, n > 1 is judged on form.
        assert "not teacher-scored" in rows["n_gt_1"]["speculative"]["reason"]
