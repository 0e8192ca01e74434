"""Config texts the tests share: one place for a setting a test needs only as scenery."""

from __future__ import annotations

# Only liveness enforces: five healthy pairs decide PASS whatever the timing; every other
# gate runs dry, so a slow or noisy machine cannot change a verdict.
LIVENESS_ONLY_GATES = """
[gates.liveness]
min_samples = 5
window_pairs = 10
[gates.error]
mode = "dry_run"
[gates.latency]
mode = "dry_run"
[gates.quality]
mode = "dry_run"
[gates.speedup]
mode = "dry_run"
[gates.drift]
mode = "dry_run"
"""

LIVENESS_ONLY = "\n[prompts]\nmax_tokens = 8\n" + LIVENESS_ONLY_GATES
