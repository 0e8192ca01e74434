"""Detector readings on the product's pairs: over a full evaluation of healthy pairs from
the real pair runner, every CUSUM check carries the figures its detail prints."""

from __future__ import annotations

import re

import pytest

from gates import GatesConfig, evaluate_all, pin_reference
from gates.core import checks
from gates.pairs.testing import at
from tests.support.soak import _quiet_pair_logs, healthy_records  # noqa: F401


class TestDetectorReading:
    def test_every_check_with_a_cusum_carries_its_reading(self) -> None:
        """Over a full evaluation of 600 healthy pairs (drift references pinned from the
        first 300), every leaf check whose detail names a CUSUM carries a `detector`
        with the same S and h (of the side nearest h when there are two), the largest
        peak, and `progress` = S / h — the figures the metrics
        and the benchmark read without parsing text. The JSON form carries them too."""
        records = healthy_records(3, 600)
        references = pin_reference(records[:300])
        decisions = evaluate_all(records, GatesConfig(), now=at(600), references=references)
        note = re.compile(r"CUSUM (\d+\.\d+) \(peak (\d+\.\d+)\) vs h (\d+\.\d+)")
        seen = 0

        for top in decisions:
            for leaf in checks([top]):
                found = note.findall(leaf.detail)
                if not found:
                    assert leaf.detector is None, leaf.name
                    continue
                seen += 1
                reading = leaf.detector
                assert reading is not None, leaf.name
                closest = max(found, key=lambda f: float(f[0]) / float(f[2]))
                assert reading.statistic == pytest.approx(float(closest[0]), abs=0.006)
                assert reading.peak == pytest.approx(max(float(f[1]) for f in found), abs=0.006)
                assert reading.threshold == pytest.approx(float(closest[2]), abs=0.006)
                assert reading.progress == pytest.approx(reading.statistic / reading.threshold)
                assert leaf.to_dict()["detector"]["progress"] == reading.progress
        assert seen >= 10
