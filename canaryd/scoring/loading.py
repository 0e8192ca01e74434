"""Loading the `evaluate` metric modules that ship with canaryd, once per process.

The modules live in ``canaryd/scoring/evaluate_modules/<name>/<name>.py``. `evaluate.load` given
a local directory whose script has the directory's name goes straight to
``LocalEvaluationModuleFactory`` (``evaluate.loading.evaluation_module_factory``): it
never contacts the hub, so loading works with ``HF_HUB_OFFLINE=1`` and no network. It
does copy the script into ``HF_MODULES_CACHE`` (default
``~/.cache/huggingface/modules``) to import it, so that directory must be writable;
a hardened service points ``HF_HOME`` at its state directory.

`evaluate`'s ``compute()`` writes every call's inputs through an Arrow table and
reseeds the random generators, ~2.5 ms per call, which is more than all of canaryd's
per-pair scoring together. `ScoringMetrics` therefore calls each loaded module's
``_compute``, the metric's own code that ``compute()`` ends in (evaluate's documented
extension point, written by us in the scripts above); the tests check both agree.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from canaryd.errors import MetricUnavailableError

METRICS_DIR = Path(__file__).resolve().parent / "evaluate_modules"

ROUGE_L = "canaryd_rouge_l"
CHRF = "canaryd_chrf"
TOKEN_EDIT_SIMILARITY = "canaryd_token_edit_similarity"  # noqa: S105 -- a metric name, no secret

# What each module imports beyond the standard library (evaluate itself imports datasets).
METRIC_DEPENDENCIES: dict[str, tuple[str, ...]] = {
    ROUGE_L: ("evaluate", "datasets", "rouge_score", "rapidfuzz"),
    CHRF: ("evaluate", "datasets", "sacrebleu"),
    TOKEN_EDIT_SIMILARITY: ("evaluate", "datasets", "rapidfuzz"),
}


def metric_path(name: str) -> Path:
    """The directory of a shipped metric module, as `evaluate.load` takes it."""
    return METRICS_DIR / name


def load_metric(name: str) -> Any:
    """Load one shipped metric module with `evaluate.load`.

    Raises `MetricUnavailableError` naming the first missing package, never returns a
    stand-in: a metric that silently scored 0 would look like a regression.
    """
    for package in METRIC_DEPENDENCIES[name]:
        try:
            importlib.import_module(package)
        except ImportError as exc:
            raise MetricUnavailableError(name, package) from exc
    import evaluate

    try:
        # keep_in_memory: should anyone call compute(), it buffers in memory, not in
        # cache files with locks under ~/.cache.
        return evaluate.load(str(metric_path(name)), keep_in_memory=True)
    except ImportError as exc:  # a dependency of a dependency, named by `evaluate`
        raise MetricUnavailableError(name, getattr(exc, "name", None) or str(exc)) from exc


@dataclass(frozen=True, slots=True)
class ScoringMetrics:
    """The three loaded metric modules, each scoring one prediction against one reference."""

    rouge_l_module: Any
    chrf_module: Any
    token_edit_similarity_module: Any

    def rouge_l(self, prediction: str, reference: str) -> float:
        """ROUGE-L F-measure, 0..1 (0 when either text has no tokens)."""
        result = self.rouge_l_module._compute(predictions=[prediction], references=[reference])
        return float(result["rouge_l"])

    def chrf(self, prediction: str, reference: str) -> float:
        """Sentence chrF, 0..100."""
        result = self.chrf_module._compute(predictions=[prediction], references=[reference])
        return float(result["chrf"])

    def token_edit_similarity(self, prediction: Sequence[Any], reference: Sequence[Any]) -> float:
        """1 - normalised Levenshtein distance, 0..1 (1.0 for two empty sequences)."""
        result = self.token_edit_similarity_module._compute(
            predictions=[prediction], references=[reference]
        )
        return float(result["token_edit_similarity"])


_lock = threading.Lock()
_loaded: ScoringMetrics | None = None


def load_metrics() -> ScoringMetrics:
    """The process's metric modules, loaded on the first call and cached.

    The daemon calls this at start so that a missing package fails there, not on the
    first pair. Thread-safe: scheduler jobs may score pairs concurrently.
    """
    global _loaded
    if _loaded is None:
        with _lock:
            if _loaded is None:
                _loaded = ScoringMetrics(
                    rouge_l_module=load_metric(ROUGE_L),
                    chrf_module=load_metric(CHRF),
                    token_edit_similarity_module=load_metric(TOKEN_EDIT_SIMILARITY),
                )
    return _loaded
