"""canaryd.parity.report: a probe run's table names the capabilities the speculative arm
regresses on, and reads back from the dict it is stored as."""

from __future__ import annotations

from canaryd.parity.checks import Outcome
from canaryd.parity.report import CapabilityResult, ProbeReport

PASS = Outcome("pass", "ok")


def report() -> ProbeReport:
    return ProbeReport(
        arm="spec",
        capabilities=(
            CapabilityResult("stop", PASS, Outcome("fail", "ran past the stop")),
            CapabilityResult("logprobs", PASS, Outcome("unsupported", "400")),
            CapabilityResult("n_gt_1", Outcome("fail", "one choice"), Outcome("fail", "one")),
            CapabilityResult("json_schema", PASS, PASS),
        ),
        context_limit=4096,
        elapsed_s=12.3456,
        read_caps={"probe_answer_bytes": 2},
        not_run=("burst_16",),
    )


class TestProbeReport:
    def test_regressions_are_what_the_baseline_passes_and_the_arm_does_not(self) -> None:
        """A failed or unsupported capability regresses only where the baseline passes."""
        assert report().regressions == ["stop", "logprobs"]

    def test_the_stored_dict_reads_back(self) -> None:
        """`from_dict(to_dict())` is the report again, but for the elapsed time rounded
        to milliseconds."""
        original = report()
        stored = original.to_dict()
        assert stored["regressions"] == ["stop", "logprobs"]
        assert stored["elapsed_s"] == 12.346
        again = ProbeReport.from_dict(stored)
        assert again.capabilities == original.capabilities
        assert (again.arm, again.context_limit, again.read_caps, again.not_run) == (
            "spec",
            4096,
            {"probe_answer_bytes": 2},
            ("burst_16",),
        )

    def test_a_dict_without_the_later_keys_reads_back(self) -> None:
        """A stored table without `read_caps`, `not_run` or `elapsed_s` reads with none."""
        stored = report().to_dict()
        for key in ("read_caps", "not_run", "elapsed_s"):
            del stored[key]
        again = ProbeReport.from_dict(stored)
        assert (again.read_caps, again.not_run, again.elapsed_s) == ({}, (), 0.0)
