"""The `Engine` protocol: the one seam between canaryd and whatever generates text."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from engine.types import GenerationRequest, GenerationResult, Message, TeacherScore


@runtime_checkable
class Engine(Protocol):
    """Generates one completion per request. Implementations never raise for a failed
    generation: they return a `GenerationResult` whose `error` says what went wrong."""

    @property
    def identity(self) -> dict[str, str]:
        """What this engine is (kind, model, speculative method...) for the run record."""
        ...

    @property
    def speculative(self) -> bool: ...

    def load(self) -> None:
        """Load weights / open connections and warm up. Idempotent."""
        ...

    def generate(self, request: GenerationRequest) -> GenerationResult: ...

    def count_tokens(self, text: str) -> list[int]:
        """Token ids of `text` under this engine's tokenizer (used by scoring)."""
        ...

    def score(self, messages: tuple[Message, ...], output: GenerationResult) -> TeacherScore | None:
        """How this engine's model judges `output` (its token ids, else its text) as the
        reply to `messages`: the teacher of sampled pairs. None where it cannot score."""
        ...

    def close(self) -> None: ...
