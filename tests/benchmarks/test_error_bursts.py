"""The shared-burst benchmark on a few bursts: it judges with the production gates, the
screen is what separates the two error-gate rows, and the JSON has what docs/gates.md
quotes."""

from __future__ import annotations

import json

from benchmarks import error_bursts


def test_the_screen_is_what_stops_the_trips() -> None:
    """40 seeded bursts after 600 calm pairs: without the screen and the settle delay the
    error gate trips on several of them (about a quarter of bursts at the full run's
    scale); with them on, on none; nor does the liveness gate (before its rate rule was
    measured against the baseline's own rate, 3 of these 40 bursts tripped it)."""
    report = error_bursts.run(40, calm_pairs=600, seed=1)
    json.dumps(report)
    gates = report["gates"]
    assert set(gates) == {"error", "error_unscreened", "liveness"}
    assert gates["error_unscreened"]["trips"] >= 4
    assert gates["error"]["trips"] == 0
    assert gates["liveness"]["trips"] == 0
    assert report["config"]["settle_pairs"] == 10
    per_30 = report["bursts_per_30_days"]
    assert per_30 == 30 * 86_400 / 10 / 5_000
    row = gates["error_unscreened"]
    assert row["trips_per_30_days"] == row["trips"] / 40 * per_30
    assert row["per_burst"] <= row["per_burst_upper95"] <= 1.0
