"""The text metrics of `canaryd.scoring.text_metrics`, loaded once per process.

`load_metrics` checks that each metric's package imports (sacrebleu, rapidfuzz) and
raises `MetricUnavailableError` naming the first one missing, never returning a stand-in:
a metric that silently scored 0 would look like a regression. The daemon and `judge`
call it at start, so that a broken install fails there, not on the first pair.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from canaryd.errors import MetricUnavailableError

ROUGE_L = "canaryd_rouge_l"
CHRF = "canaryd_chrf"
TOKEN_EDIT_SIMILARITY = "canaryd_token_edit_similarity"  # noqa: S105 -- a metric name, no secret

# What each metric imports beyond the standard library, in the order they are checked.
METRIC_DEPENDENCIES: dict[str, tuple[str, ...]] = {
    ROUGE_L: ("rapidfuzz",),
    CHRF: ("sacrebleu",),
    TOKEN_EDIT_SIMILARITY: ("rapidfuzz",),
}


@dataclass(frozen=True, slots=True)
class ScoringMetrics:
    """The three metrics, each scoring one prediction against one reference:
    `rouge_l` (F-measure, 0..1), `chrf` (0..100), `token_edit_similarity` (0..1)."""

    rouge_l: Callable[[str, str], float]
    chrf: Callable[[str, str], float]
    token_edit_similarity: Callable[[Sequence[Hashable], Sequence[Hashable]], float]


_lock = threading.Lock()
_loaded: ScoringMetrics | None = None


def load_metrics() -> ScoringMetrics:
    """The process's metrics, imported on the first call and cached. Thread-safe:
    scheduler jobs may score pairs concurrently."""
    global _loaded
    if _loaded is None:
        with _lock:
            if _loaded is None:
                for name, packages in METRIC_DEPENDENCIES.items():
                    for package in packages:
                        try:
                            importlib.import_module(package)
                        except ImportError as exc:
                            raise MetricUnavailableError(name, package) from exc
                from canaryd.scoring import text_metrics  # sacrebleu: only once scoring

                _loaded = ScoringMetrics(
                    rouge_l=text_metrics.rouge_l,
                    chrf=text_metrics.chrf,
                    token_edit_similarity=text_metrics.token_edit_similarity,
                )
    return _loaded
