"""canaryd.parity.stored: a finished probe run's stored table is the parity gate's
evidence; any other run, an unfinished one or an unreadable table is none."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

import pytest

from canaryd.parity.checks import Outcome
from canaryd.parity.report import CapabilityResult, ProbeReport
from canaryd.parity.stored import probe_evidence
from canaryd.store import StoredRun
from gates.parity import CapabilityParity
from gates.records import RunInfo

STARTED = datetime(2024, 5, 1, 12, tzinfo=UTC)
FINISHED = datetime(2024, 5, 1, 12, 1, tzinfo=UTC)
TABLE = ProbeReport(
    arm="spec",
    capabilities=(
        CapabilityResult("stop", Outcome("pass", "ok"), Outcome("fail", "ran past")),
        CapabilityResult("n_gt_1", Outcome("fail", "one choice"), Outcome("pass", "ok")),
    ),
    context_limit=None,
    elapsed_s=1.0,
).to_dict()


def run(
    section: Any = TABLE,
    kind: Literal["probe", "judge"] = "probe",
    finished: datetime | None = FINISHED,
) -> StoredRun:
    config = {} if section is None else {"probe": section}
    return StoredRun(RunInfo("probe-1", kind, STARTED, config, "h", {}, {}), finished)


class TestProbeEvidence:
    def test_a_finished_probe_is_evidence(self) -> None:
        """Each capability keeps both states and the reason of the arm that matters: the
        speculative arm's where the baseline passes, else the baseline's."""
        evidence = probe_evidence(run())
        assert evidence is not None
        assert (evidence.run_id, evidence.arm) == ("probe-1", "spec")
        assert (evidence.started_at, evidence.finished_at) == (STARTED, FINISHED)
        assert evidence.capabilities == (
            CapabilityParity("stop", "pass", "fail", "ran past"),
            CapabilityParity("n_gt_1", "fail", "pass", "one choice"),
        )

    @pytest.mark.parametrize(
        "stored",
        [
            run(kind="judge"),
            run(finished=None),
            run(section=None),
            run(section={"arm": "spec"}),
            run(section={"arm": "spec", "capabilities": [{"name": "stop"}]}),
        ],
        ids=["another-kind", "unfinished", "no-table", "no-capabilities", "no-outcomes"],
    )
    def test_anything_else_is_none(self, stored: StoredRun) -> None:
        """A run of another kind, one still running, or a table that cannot be read is
        no evidence."""
        assert probe_evidence(stored) is None
