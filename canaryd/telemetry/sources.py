"""The telemetry-source seam: one protocol every source satisfies, and the one factory
that picks a source for an arm's configuration.

A source reads one arm at one instant into an `ArmReading`; what the servers did is in
the reading (answers or failures), so `read` never raises for it. The direct scrape
(`scrape.ScrapeSource`) is the one implemented; an arm configured with `prometheus_url`
is refused by the factory with the key to change, until a PromQL source (over the
templates in `promql`) stands beside it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from canaryd.errors import ConfigError
from canaryd.telemetry.config import TelemetryConfig
from canaryd.telemetry.scrape import ScrapeSource
from canaryd.telemetry.signals import ArmReading


class TelemetrySource(Protocol):
    """One arm's production telemetry."""

    arm: str

    def read(self, now: datetime) -> ArmReading:
        """Every replica's reading (or failure) at `now`; never raises for a server."""
        ...

    def close(self) -> None: ...


def open_source(arm: str, config: TelemetryConfig, source: str = "[telemetry]") -> TelemetrySource:
    """The source of `arm`'s telemetry as `config` sets it; `ConfigError` naming the key
    (in `source`, the configuration's file) when the arm has none or a PromQL one."""
    key = f"telemetry.arms.{arm}"
    arm_config = config.arms.get(arm)
    if arm_config is None:
        raise ConfigError(source, key, "no telemetry source for this arm")
    if not arm_config.direct:
        raise ConfigError(
            source,
            f"{key}.prometheus_url",
            "PromQL sources are not read yet; scrape the replicas with metrics_url",
        )
    return ScrapeSource(arm, arm_config, timeout_s=config.timeout_s, max_bytes=config.max_bytes)
