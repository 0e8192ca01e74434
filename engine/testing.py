"""Small real models built in code, for fast tests and offline experiments.

`tiny_llama()` makes a randomly initialised Llama (a few hundred thousand parameters)
with a byte-level BPE tokenizer trained on a built-in corpus and a ChatML chat
template. It is a real transformers model: generate, assisted generation and prompt
lookup run through exactly the code paths the embedded model uses, in milliseconds.
`chaotic_llama()` is the same model with large random weights, whose next token depends
on the whole context.
"""

from __future__ import annotations

from typing import Any

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding drafts tokens cheaply and verifies them with the target model.",
    "Summarise the following passage in one sentence.",
    "Translate into French: the cat sleeps on the warm mat.",
    "def add(a, b):\n    return a + b\n",
    '{"name": "canary", "ok": true, "items": [1, 2, 3]}',
    "Question: what is 12 times 7? Answer: 84.",
    "投机解码可以加速大语言模型的推理。",
    "Rewrite the sentence, keeping its meaning: the report was written by the team.",
]


def tiny_tokenizer() -> Any:
    """A byte-level BPE tokenizer (any Unicode text encodes) with ChatML specials."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        _CORPUS * 4, vocab_size=400, min_frequency=1, special_tokens=specials, show_progress=False
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def tiny_llama(
    seed: int = 0, *, layers: int = 2, hidden: int = 64, tokenizer: Any = None
) -> tuple[Any, Any]:
    """A randomly initialised LlamaForCausalLM and its tokenizer, on the CPU, in eval mode."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = tokenizer if tokenizer is not None else tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    torch.random.set_rng_state(generator_state)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.eval()
    return model, tokenizer


def chaotic_llama(seed: int = 0) -> tuple[Any, Any]:
    """The tiny Llama with large random weights: unlike the default initialisation
    (whose greedy output repeats one token forever) its next token depends on the
    whole context, so a KV cache holding the wrong entries changes the output."""
    import torch

    model, tokenizer = tiny_llama(seed=seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    return model, tokenizer
