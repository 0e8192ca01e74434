"""Engine configurations, one pydantic model per engine `kind` (a tagged union).

The daemon's Settings embed `EngineConfig` for each arm; `engine.registry.build_engine`
turns one into a running `Engine`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SecretStr,
    Tag,
    field_validator,
    model_validator,
)

from engine.bounds import check_bounds


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    _bounded = field_validator("*")(check_bounds)


DEFAULT_HEADS_TREE: tuple[int, ...] = (3, 2, 2, 1)
DEFAULT_TREE_NODES = 12


class SpeculativeConfig(_Strict):
    """How the speculative arm drafts. `num_draft_tokens` is k: the most tokens one
    verify step can accept is k + 1 (k drafted plus the target's bonus token)."""

    method: Literal["prompt_lookup", "draft_model", "early_exit", "draft_heads"] = "prompt_lookup"
    num_draft_tokens: int = Field(
        default=8,
        ge=1,
        le=64,
        description="draft_heads: the tree depth (heads used), default len(tree_topk) or 4",
    )
    max_ngram_size: int = Field(default=2, ge=1, le=16, description="prompt_lookup only")
    adaptive: bool = Field(
        default=False,
        description="prompt_lookup only: adapt the draft length to acceptance (+2 after a "
        "fully accepted draft, -1 after a rejection, between 1 and num_draft_tokens)",
    )
    draft_model: str | None = Field(default=None, description="draft_model only: path")
    early_exit_layer: int | None = Field(default=None, ge=1, description="early_exit only")
    causal: bool = Field(
        default=True,
        description="draft_heads only: causally dependent heads (each also sees the drafted "
        "path, Hydra-style); false: independent heads (Medusa-style)",
    )
    tree_topk: tuple[int, ...] | None = Field(
        default=None,
        description="draft_heads only: children per node at each depth (all 1: a chain); "
        f"default {list(DEFAULT_HEADS_TREE)}, cut or padded with 1 to num_draft_tokens",
    )
    max_tree_nodes: int = Field(
        default=DEFAULT_TREE_NODES,
        ge=1,
        le=512,
        description="draft_heads only: node budget; the tree keeps its likeliest nodes",
    )
    fault: Literal["greedy_verify", "garbage_sampling"] | None = Field(
        default=None,
        description="a deliberate bug for drills: 'greedy_verify' verifies drafts by "
        "argmax match (greedy verification) even when sampling (no longer lossless); "
        "'garbage_sampling' replaces a verified token by a random one with probability "
        "fault_rate when sampling (greedy requests untouched); not with draft_heads",
    )
    fault_rate: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="garbage_sampling only: the chance that a verified token is replaced",
    )
    numeric_noise: float = Field(
        default=0.0,
        ge=0,
        le=100,
        description="drills: add logit noise of this size (uniform, ± the value) on every "
        "generated position, as bf16 kernels do: greedy outputs then differ only where the "
        "top two logits nearly tie; not with draft_heads",
    )

    @model_validator(mode="before")
    @classmethod
    def _heads_depth(cls, data: Any) -> Any:
        """For draft_heads, an unset num_draft_tokens is the tree's depth."""
        heads = isinstance(data, dict) and data.get("method") == "draft_heads"
        if heads and data.get("num_draft_tokens") is None:
            tree = data.get("tree_topk")
            depth = len(tree) if tree else len(DEFAULT_HEADS_TREE)
            return {**data, "num_draft_tokens": depth}
        return data

    @model_validator(mode="after")
    def _method_fields(self) -> SpeculativeConfig:
        if self.method == "draft_model" and not self.draft_model:
            raise ValueError("method 'draft_model' needs draft_model (a model path)")
        if self.numeric_noise > 0 and self.method == "draft_heads":
            raise ValueError("numeric_noise is not supported with draft_heads")
        if self.fault == "garbage_sampling" and self.method == "draft_heads":
            raise ValueError("fault 'garbage_sampling' is not supported with draft_heads")
        if self.method == "early_exit" and self.early_exit_layer is None:
            raise ValueError("method 'early_exit' needs early_exit_layer (a layer count)")
        if self.tree_topk is not None:
            if len(self.tree_topk) != self.num_draft_tokens:
                raise ValueError(
                    f"tree_topk has {len(self.tree_topk)} depths but num_draft_tokens is "
                    f"{self.num_draft_tokens}: give one of them, or make them agree"
                )
            if not all(1 <= k <= 64 for k in self.tree_topk):
                raise ValueError(f"tree_topk {list(self.tree_topk)}: each entry in 1 … 64")
        return self

    @property
    def heads_tree(self) -> tuple[int, ...]:
        """draft_heads: children per node at each depth, num_draft_tokens deep."""
        if self.tree_topk is not None:
            return self.tree_topk
        depth = self.num_draft_tokens
        return (DEFAULT_HEADS_TREE + (1,) * depth)[:depth]


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
    latency_sigma: float = Field(
        default=0.0, ge=0, description="log-normal sd of a whole request's duration"
    )
    acceptance_sd: float = Field(
        default=0.0, ge=0, description="sd of each request's per-token acceptance rate"
    )
    realtime: bool = False
    num_draft_tokens: int = Field(default=4, ge=1)
    acceptance_rate: float = Field(default=0.7, ge=0, le=1, description="per drafted token")
    acceptance_rate_by_category: dict[str, float] = Field(default_factory=dict)
    # Faults, applied after the healthy behaviour above:
    error_rate: float = Field(default=0.0, ge=0, le=1)
    timeout_rate: float = Field(default=0.0, ge=0, le=1)
    corrupt_rate: float = Field(default=0.0, ge=0, le=1, description="outputs altered")
    greedy_bias: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="speculative only, when sampling: share of output words swapped for "
        "the likeliest word under the fake teacher (`score`), as argmax verification would",
    )
    latency_factor: float = Field(default=1.0, gt=0, description="multiplies all timings")
    latency_factor_by_category: dict[str, float] = Field(
        default_factory=dict,
        description="per prompt category, multiplies all timings too (one slow category)",
    )
    tail_rate: float = Field(default=0.0, ge=0, le=1, description="requests made slow")
    tail_factor: float = Field(default=1.0, gt=0, description="how slow a tail request is")

    @model_validator(mode="after")
    def _positive_category_factors(self) -> FakeEngineConfig:
        for category, factor in self.latency_factor_by_category.items():
            if not factor > 0:
                raise ValueError(
                    f"latency_factor_by_category[{category!r}] = {factor!r}: a timing factor "
                    "must be greater than 0"
                )
        return self


class HTTPTimeouts(_Strict):
    """Seconds. `read` bounds the gap between two streamed chunks (a stalled server);
    `total` bounds the whole request, retries included (a request's own `timeout_s`
    lowers it further)."""

    connect: float = Field(default=5.0, gt=0)
    read: float = Field(default=60.0, gt=0)
    total: float = Field(default=300.0, gt=0)


class OpenAIEngineConfig(_Strict):
    """A remote OpenAI-compatible server (vLLM, SGLang, TGI, llama.cpp) as one arm."""

    kind: Literal["openai"] = "openai"
    base_url: str = Field(description="server root, e.g. http://127.0.0.1:8000 (no /v1)")
    api: Literal["chat", "completions"] = "chat"
    model: str = Field(default="default", description="the `model` field sent to the server")
    speculative: bool = Field(
        default=False, description="this arm is the speculative deployment: read acceptance"
    )
    server_kind: Literal["vllm", "sglang", "tgi", "llamacpp", "generic"] = Field(
        default="generic", description="selects how acceptance is read"
    )
    metrics_url: str | None = Field(
        default=None,
        description="window aggregates: vLLM/TGI Prometheus /metrics, SGLang /server_info",
    )
    num_draft_tokens: int | None = Field(
        default=None, ge=1, description="k, for servers that do not report drafted tokens (TGI)"
    )
    api_key: SecretStr | None = None
    api_key_env: str | None = Field(default=None, description="environment variable to read")
    api_key_file: Path | None = Field(default=None, description="file whose content is the key")
    timeouts: HTTPTimeouts = Field(default_factory=HTTPTimeouts)
    max_retries: int = Field(
        default=2,
        ge=0,
        le=10,
        description="only connection failures and 429/503 answered before any token",
    )
    tls_verify: bool = True
    ca_bundle: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    max_concurrency: int = Field(default=4, ge=1, le=1024, description="in-flight requests")
    top_logprobs: int = Field(
        default=5,
        ge=0,
        le=20,
        description="baseline arms, greedy requests: ask the server for this many top "
        "log-probs per output token (`top_logprobs`, or `logprobs` on completions), the "
        "teacher that judges greedy divergences on servers without prompt log-probs; 0 "
        "never asks. A server that refuses them (400/422) is asked again without",
    )
    extra_body: dict[str, Any] = Field(
        default_factory=dict, description="merged into every request body"
    )

    @model_validator(mode="after")
    def _one_key_source(self) -> OpenAIEngineConfig:
        sources = [self.api_key is not None, bool(self.api_key_env), self.api_key_file is not None]
        if sum(sources) > 1:
            raise ValueError("set at most one of api_key, api_key_env, api_key_file")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {self.base_url!r}")
        if self.client_key is not None and self.client_cert is None:
            raise ValueError("client_key needs client_cert")
        return self


def _engine_kind(value: Any) -> str:
    """An arm without `kind` is the in-process transformers engine."""
    kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
    return str(kind or "transformers")


EngineConfig = Annotated[
    Annotated[TransformersEngineConfig, Tag("transformers")]
    | Annotated[FakeEngineConfig, Tag("fake")]
    | Annotated[OpenAIEngineConfig, Tag("openai")],
    Discriminator(_engine_kind),
]
