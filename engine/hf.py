"""The in-process Hugging Face transformers engine: baseline and speculative arms.

The baseline arm is plain autoregressive `generate`. The speculative arm uses
transformers' assisted generation (prompt lookup, a draft model, or early exit) and
counts acceptance *inside* the decoding loop: the candidate generator that
`generate` builds is wrapped so that every draft (`get_candidates`) and every
verification result (`update_candidate_strategy`, called with the number of draft
tokens the target kept) is recorded. Timings come from a streamer that stamps each
batch of tokens as the loop emits it, so TTFT is the time to the first token actually
produced, not an estimate, and the gaps between tokens (`InterTokenLatency`) are those
of each verify step's emitted tokens. `draft_heads` runs canaryd's own tree loop instead
(`engine.heads.decode`), which counts and times itself. Weights are loaded once per
(source, device, dtype) and shared by the engines that name them; the last engine to
close releases them.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import structlog
import torch

# At import, in the thread that builds the engine: generations run on worker threads, and
# first imports from transformers' lazy module are not thread-safe.
from transformers import LogitsProcessorList

from engine.config import SpeculativeConfig, TransformersEngineConfig
from engine.errors import EngineConfigError
from engine.heads.decode import HeadsDecoder, heads_decoder
from engine.heads.model import DraftHeads
from engine.hf_hooks import (
    AcceptanceCounter,
    GarbageSamplingFault,
    GreedyVerifyFault,
    NumericNoise,
    RecordingCandidateGenerator,
    TimingStreamer,
)
from engine.timing import ArrivalClock
from engine.types import (
    AcceptanceSource,
    DraftCost,
    ErrorKind,
    GenerationRequest,
    GenerationResult,
    Message,
    TeacherScore,
)

log = structlog.get_logger(__name__)


class _LoadedModel:
    """A model and tokenizer shared by every engine that names the same weights."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.lock = threading.Lock()  # one generate at a time: seeds are process-global
        self.counter: AcceptanceCounter | None = None
        self.users = 0  # engines holding it through `_load_shared`
        original = model._get_candidate_generator

        def recording_candidate_generator(*args: Any, **kwargs: Any) -> Any:
            inner = original(*args, **kwargs)
            return (
                inner if self.counter is None else RecordingCandidateGenerator(inner, self.counter)
            )

        # Instance attribute: only this model object records; transformers is untouched.
        model._get_candidate_generator = recording_candidate_generator


_LoadedKey = tuple[str, str, str]
_LOADED: dict[_LoadedKey, _LoadedModel] = {}
_LOADED_LOCK = threading.Lock()


def _load_shared(source: str, device: str, dtype: str, models_dir: Path | None) -> _LoadedModel:
    from engine.loading import load_causal_lm

    key = (source, device, dtype)
    with _LOADED_LOCK:
        if key not in _LOADED:
            model, tokenizer = load_causal_lm(
                source, device=device, dtype=dtype, models_dir=models_dir
            )
            _LOADED[key] = _LoadedModel(model, tokenizer)
        _LOADED[key].users += 1
        return _LOADED[key]


def _release_shared(key: _LoadedKey) -> None:
    """One engine no longer uses the weights of `key`; the last one frees them (a
    reload to another model must not keep the old one in GPU memory)."""
    with _LOADED_LOCK:
        loaded = _LOADED.get(key)
        if loaded is None:
            return
        loaded.users -= 1
        if loaded.users > 0:
            return
        del _LOADED[key]
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class TransformersEngine:
    """Baseline (autoregressive) or speculative (assisted) decoding in this process."""

    def __init__(
        self,
        config: TransformersEngineConfig,
        *,
        models_dir: Path | None = None,
        model: Any = None,
        tokenizer: Any = None,
        draft_model: Any = None,
        heads: DraftHeads | None = None,
    ) -> None:
        self.config = config
        self._models_dir = models_dir
        self._shared = _LoadedModel(model, tokenizer) if model is not None else None
        self._draft_model = draft_model
        self._heads = heads  # draft_heads: given here (tests), else the trained ones
        self._decoder: HeadsDecoder | None = None
        self._loaded = False
        # What `_load_shared` gave this engine ("target", "draft"); close() releases it.
        self._held: dict[str, _LoadedKey] = {}

    # -- identity -----------------------------------------------------------------
    @property
    def speculative(self) -> bool:
        return self.config.speculative is not None

    @property
    def identity(self) -> dict[str, str]:
        spec = self.config.speculative
        ident = {
            "kind": "transformers",
            "model": self.config.model,
            "device": str(self._device) if self._loaded else self.config.device,
            "dtype": self.config.dtype,
            "mode": "speculative" if spec else "baseline",
        }
        if spec is not None:
            ident |= {"method": spec.method, "num_draft_tokens": str(spec.num_draft_tokens)}
            if spec.fault is not None:
                ident["fault"] = spec.fault
            if spec.method == "prompt_lookup":
                ident["max_ngram_size"] = str(spec.max_ngram_size)
            elif spec.method == "draft_model":
                ident["draft_model"] = str(spec.draft_model)
            elif spec.method == "draft_heads":
                ident |= {
                    "causal": str(spec.causal).lower(),
                    "tree_topk": ",".join(map(str, spec.heads_tree)),
                    "max_tree_nodes": str(spec.max_tree_nodes),
                }
                if self._decoder is not None:
                    ident["draft_bytes"] = str(self._decoder.heads.extra_bytes())
            else:
                ident["early_exit_layer"] = str(spec.early_exit_layer)
        return ident

    # -- lifecycle ----------------------------------------------------------------
    def load(self) -> None:
        if self._loaded:
            return
        if self._shared is None:
            self._shared = _load_shared(
                self.config.model, self.config.device, self.config.dtype, self._models_dir
            )
            self._held["target"] = (self.config.model, self.config.device, self.config.dtype)
        spec = self.config.speculative
        if spec is not None and spec.method == "draft_model" and self._draft_model is None:
            assert spec.draft_model is not None  # guaranteed by SpeculativeConfig
            self._draft_model = _load_shared(
                spec.draft_model, self.config.device, self.config.dtype, self._models_dir
            ).model
            self._held["draft"] = (spec.draft_model, self.config.device, self.config.dtype)
        if spec is not None and spec.method == "early_exit":
            layers = int(self._shared.model.config.num_hidden_layers)
            if spec.early_exit_layer is None or spec.early_exit_layer >= layers:
                raise EngineConfigError(
                    "speculative.early_exit_layer",
                    f"{spec.early_exit_layer} must be below the model's {layers} layers",
                )
        if spec is not None and spec.method == "draft_heads":
            self._decoder = heads_decoder(
                self._shared.model, spec, self._heads, self.config.model, self._models_dir
            )
        self._configure_drafter()
        self._loaded = True
        if self.config.warmup_tokens:
            self._warm_up()

    def close(self) -> None:
        self._loaded = False
        # A model handed to the constructor is the caller's; only shared weights are
        # released, this engine's references dropped first so the last release frees them.
        held, self._held = self._held, {}
        if "target" in held:
            self._shared = None
        if "draft" in held:
            self._draft_model = None
        self._decoder = None
        for key in held.values():
            _release_shared(key)

    @property
    def _device(self) -> torch.device:
        assert self._shared is not None
        return torch.device(self._shared.model.device)

    def _warm_up(self) -> None:
        """The first generate after load is ~10x slower; never let it be a measurement."""
        request = GenerationRequest(
            messages=(Message("user", "Say hello and repeat: hello, hello."),), request_id="warmup"
        )
        started = time.perf_counter()
        result = self.generate(request, max_new_tokens=self.config.warmup_tokens)
        log.info(
            "engine.warmed_up",
            mode=self.identity["mode"],
            error=result.error.value,
            seconds=round(time.perf_counter() - started, 3),
        )

    # -- generation ---------------------------------------------------------------
    def count_tokens(self, text: str) -> list[int]:
        self.load()
        assert self._shared is not None
        return list(self._shared.tokenizer(text, add_special_tokens=False)["input_ids"])

    def score(self, messages: tuple[Message, ...], output: GenerationResult) -> TeacherScore | None:
        """How this engine's model judges `output` as the reply to `messages`, at
        temperature 1, in one forward pass: its token ids (its text re-tokenised when it
        has none). None for an empty output or one that does not fit the model's context."""
        self.load()
        assert self._shared is not None
        token_ids = output.token_ids or tuple(self.count_tokens(output.text))
        if not token_ids or not messages:
            return None
        shared = self._shared
        with shared.lock:
            prompt_ids = self._prompt_ids(messages)
            produced = torch.tensor([list(token_ids)], dtype=prompt_ids.dtype, device=self._device)
            ids = torch.cat((prompt_ids, produced), dim=1)
            limit = getattr(shared.model.config, "max_position_embeddings", None)
            if limit is not None and int(ids.shape[1]) > int(limit):
                return None
            with torch.inference_mode():
                logits = shared.model(ids, attention_mask=torch.ones_like(ids)).logits
            start = int(prompt_ids.shape[1]) - 1
            log_probs = logits[0, start:-1].float().log_softmax(dim=-1)
            picked = log_probs.gather(1, produced[0].unsqueeze(1)).squeeze(1)
            top = log_probs.max(dim=-1).values
            # A token tied with the most likely one counts as an argmax token.
            return TeacherScore(
                tokens=len(token_ids),
                mean_nll=float(-picked.mean()),
                argmax_share=float((picked >= top).float().mean()),
                mean_top_probability=float(top.exp().mean()),
                max_nll=float(-picked.min()),
                gaps=tuple(float(g) for g in (top - picked).clamp(min=0.0).tolist()),
            )

    def _prompt_ids(self, messages: tuple[Message, ...]) -> torch.Tensor:
        assert self._shared is not None
        tokenizer = self._shared.tokenizer
        chat = [{"role": m.role, "content": m.content} for m in messages]
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        else:  # a base model without a template: plain concatenation
            text = "\n\n".join(m.content for m in messages) + "\n"
        ids: torch.Tensor = tokenizer(text, add_special_tokens=False, return_tensors="pt")[
            "input_ids"
        ]
        return ids.to(self._device)

    def _generate_kwargs(self, request: GenerationRequest, max_new_tokens: int) -> dict[str, Any]:
        assert self._shared is not None
        sampling = request.sampling
        tokenizer = self._shared.tokenizer
        kwargs: dict[str, Any] = {
            "max_new_tokens": max_new_tokens,
            "do_sample": not sampling.greedy,
            "pad_token_id": tokenizer.pad_token_id
            if tokenizer.pad_token_id is not None
            else tokenizer.eos_token_id,
        }
        if not sampling.greedy:
            kwargs |= {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": 0}
        else:  # models ship sampling defaults in generation_config; greedy means none
            kwargs |= {"temperature": None, "top_p": None, "top_k": None}
        if request.timeout_s is not None:
            kwargs["max_time"] = request.timeout_s
        spec: SpeculativeConfig | None = self.config.speculative
        if spec is not None:
            if spec.method == "prompt_lookup":
                kwargs |= {
                    "prompt_lookup_num_tokens": spec.num_draft_tokens,
                    "max_matching_ngram_size": spec.max_ngram_size,
                }
            elif spec.method == "draft_model":
                kwargs["assistant_model"] = self._draft_model
            elif spec.method == "early_exit":
                kwargs["assistant_early_exit"] = spec.early_exit_layer
        return kwargs

    def _decode_with_heads(
        self,
        request: GenerationRequest,
        prompt_ids: torch.Tensor,
        max_new_tokens: int,
        counter: AcceptanceCounter,
        streamer: TimingStreamer,
        started: float,
    ) -> tuple[torch.Tensor, DraftCost]:
        assert self._decoder is not None and self.config.speculative is not None
        timeout = request.timeout_s
        decoding = self._decoder.decode(
            prompt_ids,
            max_new_tokens=max_new_tokens,
            sampling=request.sampling,
            eos_ids=self._eos_ids(),
            recorder=counter,
            deadline=None if timeout is None else started + timeout,
            greedy_fault=self.config.speculative.fault == "greedy_verify",
        )
        streamer.first_token_at = decoding.first_token_at
        streamer.deliveries = decoding.deliveries
        return decoding.output(prompt_ids), decoding.cost

    def _eos_ids(self) -> set[int]:
        assert self._shared is not None
        eos = self._shared.model.generation_config.eos_token_id
        return set(eos if isinstance(eos, list) else [eos] if eos is not None else [])

    def _configure_drafter(self) -> None:
        """Draft exactly k tokens per step. transformers reads the draft length from the
        *assistant's* generation_config (for early exit that is the target itself); its
        defaults (a heuristic schedule and a confidence cut-off) would make k vary."""
        spec = self.config.speculative
        if spec is None or spec.method in ("prompt_lookup", "draft_heads"):
            return
        assert self._shared is not None
        assistant = self._draft_model if spec.method == "draft_model" else self._shared.model
        assistant.generation_config.num_assistant_tokens = spec.num_draft_tokens
        assistant.generation_config.num_assistant_tokens_schedule = "constant"
        assistant.generation_config.assistant_confidence_threshold = 0.0

    def generate(
        self, request: GenerationRequest, max_new_tokens: int | None = None
    ) -> GenerationResult:
        self.load()
        assert self._shared is not None
        started = time.perf_counter()
        if not request.messages or not any(m.content.strip() for m in request.messages):
            return GenerationResult.failed(ErrorKind.INVALID, "empty prompt", 0.0)
        shared = self._shared
        with shared.lock:
            prompt_ids = self._prompt_ids(request.messages)
            prompt_tokens = int(prompt_ids.shape[1])
            new_tokens = max_new_tokens or request.sampling.max_tokens
            limit = getattr(shared.model.config, "max_position_embeddings", None)
            if limit is not None and prompt_tokens + new_tokens > int(limit):
                return GenerationResult.failed(
                    ErrorKind.INVALID,
                    f"prompt of {prompt_tokens} tokens + max_tokens {new_tokens} exceeds the "
                    f"model's context of {limit}",
                    time.perf_counter() - started,
                    prompt_tokens,
                )
            spec = self.config.speculative
            counter = None
            if spec is not None:
                adaptive = spec.method == "prompt_lookup" and spec.adaptive
                counter = AcceptanceCounter(
                    adaptive_max=spec.num_draft_tokens if adaptive else None
                )
            shared.counter = counter
            if not request.sampling.greedy:
                torch.manual_seed(request.sampling.seed)
            streamer = TimingStreamer()
            kwargs = self._generate_kwargs(request, new_tokens)
            processors: list[Any] = []
            if spec is not None and spec.numeric_noise > 0:
                processors.append(NumericNoise(spec.numeric_noise, request.sampling.seed))
            if counter is not None and spec is not None and spec.fault == "greedy_verify":
                processors.append(GreedyVerifyFault(counter))
            garbage = spec is not None and spec.fault == "garbage_sampling"
            if counter is not None and spec is not None and garbage and not request.sampling.greedy:
                processors.append(
                    GarbageSamplingFault(counter, spec.fault_rate, request.sampling.seed)
                )
            if processors:
                kwargs["logits_processor"] = LogitsProcessorList(processors)
            cost = None
            try:
                with torch.inference_mode():
                    if self._decoder is not None and counter is not None:
                        output, cost = self._decode_with_heads(
                            request, prompt_ids, new_tokens, counter, streamer, started
                        )
                    else:
                        output = shared.model.generate(
                            prompt_ids,
                            attention_mask=torch.ones_like(prompt_ids),
                            streamer=streamer,
                            **kwargs,
                        )
            except torch.cuda.OutOfMemoryError as exc:
                return GenerationResult.failed(
                    ErrorKind.OOM, str(exc)[:500], time.perf_counter() - started, prompt_tokens
                )
            except RuntimeError as exc:
                kind = ErrorKind.OOM if "out of memory" in str(exc).lower() else ErrorKind.INTERNAL
                log.warning("engine.generate_failed", error=str(exc)[:500])
                return GenerationResult.failed(
                    kind, str(exc)[:500], time.perf_counter() - started, prompt_tokens
                )
            finally:
                shared.counter = None
            finished = time.perf_counter()
        return self._result(
            request, output, prompt_tokens, new_tokens, counter, streamer, started, finished, cost
        )

    def _result(
        self,
        request: GenerationRequest,
        output: torch.Tensor,
        prompt_tokens: int,
        max_new_tokens: int,
        counter: AcceptanceCounter | None,
        streamer: TimingStreamer,
        started: float,
        finished: float,
        cost: DraftCost | None = None,
    ) -> GenerationResult:
        assert self._shared is not None
        tokenizer = self._shared.tokenizer
        token_ids = tuple(int(t) for t in output[0, prompt_tokens:].tolist())
        e2e = finished - started
        eos_ids = self._eos_ids()
        error, detail = ErrorKind.NONE, ""
        if token_ids and token_ids[-1] in eos_ids:
            finish_reason = "stop"
        elif len(token_ids) >= max_new_tokens:
            finish_reason = "length"
        elif request.timeout_s is not None and e2e >= request.timeout_s:
            finish_reason = "error"  # generate's max_time cut it short
            error, detail = ErrorKind.TIMEOUT, f"generation passed {request.timeout_s} s"
        else:
            finish_reason = "stop"
        ttft = (streamer.first_token_at - started) if streamer.first_token_at else None
        tpot = None
        if streamer.first_token_at is not None and len(token_ids) > 1:
            tpot = (finished - streamer.first_token_at) / (len(token_ids) - 1)
        spec = self.config.speculative
        stats = counter.stats(spec.num_draft_tokens) if counter and spec else None
        clock = ArrivalClock(started)
        for at, tokens in streamer.deliveries:
            clock.delivered(at, tokens)
        return GenerationResult(
            text=tokenizer.decode(list(token_ids), skip_special_tokens=True),
            token_ids=token_ids,
            finish_reason=finish_reason,
            prompt_tokens=prompt_tokens,
            output_tokens=len(token_ids),
            ttft_s=ttft,
            tpot_s=tpot,
            e2e_s=e2e,
            error=error,
            error_detail=detail,
            speculative=stats,
            acceptance_source=AcceptanceSource.DECODING_LOOP
            if stats
            else AcceptanceSource.NOT_REPORTED,
            draft_cost=cost,
            itl=clock.summary(),
        )
