"""The tiny checkpoint's tokenizer: a byte-level BPE trained on a bundled English text.

Byte-level, like the real Qwen-family tokenizer, so every string encodes and decodes back
unchanged. The special tokens come after the trained vocabulary (as in Qwen, where they
start at 151643), in the order of `special_token_strings()`.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from backends.checkpoint.tokenizer import SpecialTokens

TINY_VOCAB_SIZE = 1000  # trained BPE entries plus special tokens
EOS_TOKEN = "<|endoftext|>"
AUDIO_BOS_TOKEN = "<|audio_bos|>"  # tts_config.audio_bos_token_id points here
TEXT_EOS_TOKEN = "<|text_eos|>"  # tts_config.text_eos_token_id points here
_CORPUS = "tiny_corpus.txt"
# Tokens the real tokenizer also has but the duplex runtime does not resolve.
_QWEN_TOKENS = (EOS_TOKEN, "<|im_start|>", "<|im_end|>")
_VISION_TOKENS = ("<image>", "</image>", "<slice>", "</slice>")


def special_token_strings() -> list[str]:
    """Every special token of the tiny tokenizer, in id order, without duplicates."""
    ordered = [*_QWEN_TOKENS, *_VISION_TOKENS, *SpecialTokens.token_strings().values(),
               AUDIO_BOS_TOKEN, TEXT_EOS_TOKEN]
    return list(dict.fromkeys(ordered))


def train_tiny_tokenizer() -> Tokenizer:
    """Train the BPE on the bundled corpus; the result is identical on every call."""
    specials = special_token_strings()
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE - len(specials),
        min_frequency=1,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: no unknowns
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus_lines(), trainer=trainer)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tokenizer


def _corpus_lines() -> list[str]:
    text = resources.files("backends.checkpoint").joinpath("data").joinpath(_CORPUS).read_text("utf-8")
    return text.splitlines()


def tiny_tokenizer_config(tokenizer: Tokenizer) -> dict[str, Any]:
    """tokenizer_config.json in the shape transformers writes for Qwen-family tokenizers."""
    decoder = {
        str(tokenizer.token_to_id(t)): {
            "content": t, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True,
        }
        for t in special_token_strings()
    }
    return {
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS_TOKEN,
        "errors": "replace",
        "model_max_length": 40960,
        "pad_token": EOS_TOKEN,
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }
