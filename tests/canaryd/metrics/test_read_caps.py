"""canaryd_read_caps_total (canaryd.metrics.pairs): every cap's series reads 0 from the
start; a generation past its byte cap is counted under `generation_bytes` beside its
`invalid_output` error, other `invalid_output` failures are not; the probe job's counts
are added as reported."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from prometheus_client import CollectorRegistry

from canaryd.metrics import CanarydMetrics
from canaryd.metrics.pairs import READ_CAPS
from engine.sse import OUTPUT_CAP_DETAIL
from engine.types import ErrorKind, GenerationResult, Message
from gates.records import PairRecord, Prompt

CAPS = "canaryd_read_caps_total"


@pytest.fixture
def metrics() -> CanarydMetrics:
    return CanarydMetrics(CollectorRegistry())


def sample(metrics: CanarydMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def record(speculative: GenerationResult) -> PairRecord:
    healthy = GenerationResult(
        text="ok",
        token_ids=(),
        finish_reason="stop",
        prompt_tokens=3,
        output_tokens=1,
        ttft_s=0.1,
        tpot_s=None,
        e2e_s=0.1,
    )
    return PairRecord(
        pair_id="p1",
        run_id="r1",
        prompt=Prompt("q1", "qa", (Message("user", "hello"),), max_tokens=8),
        started_at=datetime.now(UTC),
        arm_order=("baseline", "speculative"),
        baseline=healthy,
        speculative=speculative,
        scores=None,
    )


class TestReadCaps:
    def test_every_cap_reads_zero_before_anything_happens(self, metrics: CanarydMetrics) -> None:
        """Each cap's series exists at 0, so a rate over it is 0, not absent."""
        assert READ_CAPS == ("generation_bytes", "probe_answer_bytes", "probe_deadline")
        for what in READ_CAPS:
            assert sample(metrics, CAPS, what=what) == 0

    def test_a_generation_past_its_byte_cap_is_counted(self, metrics: CanarydMetrics) -> None:
        """An arm's stream cut at its byte cap: one `invalid_output` error and one
        `generation_bytes` cap."""
        capped = GenerationResult.failed(
            ErrorKind.INVALID_OUTPUT, f"{OUTPUT_CAP_DETAIL}: 82000 bytes streamed", 0.2
        )
        metrics.pairs.observe_group((record(capped),))
        assert sample(metrics, CAPS, what="generation_bytes") == 1
        errors = {"arm": "speculative", "kind": "invalid_output"}
        assert sample(metrics, "canaryd_errors_total", **errors) == 1

    def test_other_invalid_output_is_no_cap(self, metrics: CanarydMetrics) -> None:
        """An answer that cannot be true (validation) is `invalid_output` but no cap."""
        wrong = GenerationResult.failed(ErrorKind.INVALID_OUTPUT, "output_tokens -1", 0.2)
        metrics.pairs.observe_group((record(wrong),))
        assert sample(metrics, CAPS, what="generation_bytes") == 0

    def test_reported_counts_are_added_and_unknown_caps_ignored(
        self, metrics: CanarydMetrics
    ) -> None:
        """`read_capped` adds a reported count to its cap; a name outside `READ_CAPS` is
        ignored rather than growing the label set."""
        metrics.pairs.read_capped("probe_answer_bytes", 26)
        metrics.pairs.read_capped("probe_deadline")
        metrics.pairs.read_capped("anything_else", 3)
        assert sample(metrics, CAPS, what="probe_answer_bytes") == 26
        assert sample(metrics, CAPS, what="probe_deadline") == 1
        assert sample(metrics, CAPS, what="anything_else") is None
