"""The bounds of one telemetry read, and the refusal of a source that passes one.

A read of an arm's telemetry is bounded in time (`telemetry.timeout_s`, checked while the
answer arrives and while it is parsed), in bytes (`telemetry.max_bytes` of decoded answer;
a compressed one is capped while it is decoded), in series per signal
(`telemetry.max_series`) and in `le` bounds per histogram (`telemetry.max_buckets`). A
source past one of them is refused: `ReadRefusedError` names the bound (`RefusalReason`,
the bounded `reason` label of `canaryd_telemetry_refused_total`) and says in one line what
was refused; nothing of a refused read is kept, so a hostile or broken endpoint costs a
bounded amount of memory and time and never becomes evidence. Other failures of a read (no
connection, a bad status, an exposition the parser refuses) are `ScrapeFailedError`s.
"""

from __future__ import annotations

import threading
import time
from typing import Final, Literal

__all__ = [
    "DEFAULT_MAX_BUCKETS",
    "DEFAULT_MAX_SERIES",
    "REFUSAL_REASONS",
    "ByteBudget",
    "Deadline",
    "ReadRefusedError",
    "RefusalReason",
    "ScrapeFailedError",
]

RefusalReason = Literal["bytes", "deadline", "series", "buckets"]
REFUSAL_REASONS: Final[tuple[RefusalReason, ...]] = ("bytes", "deadline", "series", "buckets")
# vLLM's and SGLang's histograms have 15-25 bounds, a gateway's about 20; 64 leaves room for
# a finer layout, and 3 histograms of 256 bounds (the most the setting allows) still store
# in well under 64 KB.
DEFAULT_MAX_BUCKETS: Final = 64
# Series matching one signal on one replica (a histogram's series counted once, not per
# bucket): vLLM has one per engine and finish reason, a shared gateway one per status code,
# source and flag of the arm's workload, a few hundred at most.
DEFAULT_MAX_SERIES: Final = 4096


class ScrapeFailedError(Exception):
    """One read failed; the message is the one-line reason."""


class ReadRefusedError(ScrapeFailedError):
    """One read passed a bound (`reason`) and was refused; the message says which, naming
    the setting."""

    def __init__(self, reason: RefusalReason, message: str) -> None:
        super().__init__(message)
        self.reason: RefusalReason = reason


class Deadline:
    """`timeout_s` from now; `check` refuses a read still going past it."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._at = time.monotonic() + timeout_s

    def left(self) -> float:
        return self._at - time.monotonic()

    def check(self, url: str) -> None:
        if time.monotonic() > self._at:
            raise ReadRefusedError(
                "deadline",
                f"{url} sent no whole answer within {self.timeout_s:g} s (telemetry.timeout_s)",
            )


class ByteBudget:
    """`max_bytes` of decoded answer, shared by every answer of one read (thread-safe: an
    arm's PromQL queries run at once); `take` refuses the bytes past it."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._used = 0
        self._lock = threading.Lock()

    def take(self, size: int, url: str) -> None:
        with self._lock:
            self._used += size
            over = self._used > self.max_bytes
        if over:
            raise ReadRefusedError(
                "bytes", f"{url} sent more than {self.max_bytes} bytes (telemetry.max_bytes)"
            )
