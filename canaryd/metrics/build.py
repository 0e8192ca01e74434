"""The build-info series: which canaryd, Python, torch and transformers run, on which engines.

`BuildMetrics` owns `canaryd_build_info`, one series of value 1 whose labels carry the
versions and an allowlist of each arm's engine identity (`BUILD_IDENTITY_KEYS`). An
engine's `base_url` is reduced to scheme, host, port and path and every other value has
any credential masked, so no credential reaches a label.
"""

from __future__ import annotations

from canaryd.metrics.declare import Declarer
from canaryd.metrics.labels import (
    BUILD_IDENTITY_KEYS,
    BUILD_KEYS_MAX,
    BUILD_VALUE_MAX,
    LABEL_NAME,
    URL_IDENTITY_KEYS,
)
from canaryd.redact import public_url, redact_text


class BuildMetrics:
    """The build info, replaced whole on each `set`."""

    def __init__(self, declare: Declarer) -> None:
        self.series = declare.info(
            "canaryd_build",
            "Versions of canaryd, Python, torch and transformers, and each arm's engine "
            "identity (baseline_*, speculative_*), as labels of one series of value 1.",
            ("version", "python", "torch", "transformers", "baseline_*", "speculative_*"),
            "count by (version) (canaryd_build_info)",
        )

    def set(
        self,
        version: str,
        python: str,
        torch: str,
        transformers: str,
        baseline: dict[str, str],
        speculative: dict[str, str],
    ) -> None:
        """Replace the build info (one series; a config reload may change the engines).

        Of each engine identity only the `BUILD_IDENTITY_KEYS` are exported, URLs without
        userinfo, query or fragment, other values with any credential masked."""
        labels = {
            "version": version,
            "python": python,
            "torch": torch,
            "transformers": transformers,
        }
        for prefix, identity in (("baseline", baseline), ("speculative", speculative)):
            exported = sorted(key for key in identity if key in BUILD_IDENTITY_KEYS)
            for key in exported[:BUILD_KEYS_MAX]:
                name = f"{prefix}_{LABEL_NAME.sub('_', key).lower()}"
                value = str(identity[key])
                labels[name] = public_url(value) if key in URL_IDENTITY_KEYS else value
        self.series.info({k: redact_text(v)[:BUILD_VALUE_MAX] for k, v in labels.items()})
