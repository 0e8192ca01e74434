"""Engine configurations, one pydantic model per engine `kind` (a tagged union).

The daemon's Settings embed `EngineConfig` for each arm; `engine.registry.build_engine`
turns one into a running `Engine`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SpeculativeConfig(_Strict):
    """How the speculative arm drafts. `num_draft_tokens` is k: the most tokens one
    verify step can accept is k + 1 (k drafted plus the target's bonus token)."""

    method: Literal["prompt_lookup", "draft_model", "early_exit"] = "prompt_lookup"
    num_draft_tokens: int = Field(default=8, ge=1, le=64)
    max_ngram_size: int = Field(default=2, ge=1, le=16, description="prompt_lookup only")
    draft_model: str | None = Field(default=None, description="draft_model only: path")
    early_exit_layer: int | None = Field(default=None, ge=1, description="early_exit only")

    @model_validator(mode="after")
    def _method_fields(self) -> SpeculativeConfig:
        if self.method == "draft_model" and not self.draft_model:
            raise ValueError("method 'draft_model' needs draft_model (a model path)")
        if self.method == "early_exit" and self.early_exit_layer is None:
            raise ValueError("method 'early_exit' needs early_exit_layer (a layer count)")
        return self


class TransformersEngineConfig(_Strict):
    """The in-process Hugging Face transformers engine."""

    kind: Literal["transformers"] = "transformers"
    model: str = Field(
        default="embedded",
        description="'embedded' (SmolLM2-135M-Instruct from `canaryd models pull`), a "
        "transformers model directory, or a .gguf file",
    )
    device: str = Field(default="auto", description="auto, cpu, cuda, cuda:N")
    dtype: str = Field(default="auto", description="auto, float32, bfloat16, float16")
    speculative: SpeculativeConfig | None = None
    warmup_tokens: int = Field(default=8, ge=0)


class FakeEngineConfig(_Strict):
    """A synthetic engine for soak tests and fault injection: no model, seeded, and by
    default it only *reports* timings instead of sleeping (`realtime = false`)."""

    kind: Literal["fake"] = "fake"
    speculative: bool = False
    seed: int = 0
    ttft_s: float = Field(default=0.05, gt=0)
    tpot_s: float = Field(default=0.02, gt=0)
    jitter: float = Field(default=0.1, ge=0, description="relative log-normal sd of timings")
    realtime: bool = False
    num_draft_tokens: int = Field(default=4, ge=1)
    acceptance_rate: float = Field(default=0.7, ge=0, le=1, description="per drafted token")
    acceptance_rate_by_category: dict[str, float] = Field(default_factory=dict)
    # Faults, applied after the healthy behaviour above:
    error_rate: float = Field(default=0.0, ge=0, le=1)
    timeout_rate: float = Field(default=0.0, ge=0, le=1)
    corrupt_rate: float = Field(default=0.0, ge=0, le=1, description="outputs altered")
    latency_factor: float = Field(default=1.0, gt=0, description="multiplies all timings")
    tail_rate: float = Field(default=0.0, ge=0, le=1, description="requests made slow")
    tail_factor: float = Field(default=1.0, gt=0, description="how slow a tail request is")


def _engine_kind(value: Any) -> str:
    """An arm without `kind` is the in-process transformers engine."""
    kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
    return str(kind or "transformers")


EngineConfig = Annotated[
    Annotated[TransformersEngineConfig, Tag("transformers")]
    | Annotated[FakeEngineConfig, Tag("fake")],
    Discriminator(_engine_kind),
]
