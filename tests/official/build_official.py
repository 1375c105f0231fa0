"""Run by `.venv-official/bin/python` (transformers 4.51): the official MiniCPM-o 4.5 classes
write tiny checkpoints and compute the reference outputs that tests/official compares with.

    build_official.py --official DIR --out DIR [--seed N]

writes into --out:
- `ckpt-float32/`, `ckpt-bfloat16/`: `MiniCPMO(MiniCPMOConfig(...), init_vision=False)` with
  seeded random weights, `save_pretrained` to safetensors (the second with bf16 shards), and the
  real tokenizer files copied beside the weights (no tokenizer.json, as the official folder).
- `<name>-<variant>.npz` and `<name>-<variant>.json`: one reference output per function in
  `REFERENCES`, for the variants that list it in `VARIANTS` (a checkpoint, the dtype the
  official computes in, the references).
  A function takes an `Official` (the loaded model, the tokenizer, the processor, a seeded
  numpy generator) and returns a dict: numpy arrays go to
  the .npz, everything else to the .json. Inputs are returned too, so the tests never have to
  regenerate them. To compare another output, add one function and register it there.

Only the official code and its stack are imported here: this script never imports `backends`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import sys
import types
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F

TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json", "added_tokens.json",
                   "special_tokens_map.json")
PACKAGE = "minicpmo_official"
ALL = ("tokenizer", "thinker", "streaming_audio", "reference_voice", "talker", "released_shapes",
       "duplex")
# variant -> (shards written in, computed in, references); bf16 shards are also computed in
# float32, as a server running float32 from a bf16 checkpoint does: that variant checks the
# upcast weights (the Talker's weight-norm head above all), so it skips the long audio stream
VARIANTS = {
    "float32": (torch.float32, torch.float32, ALL),
    "bfloat16": (torch.bfloat16, torch.bfloat16, ("thinker", "streaming_audio", "reference_voice",
                                                  "talker")),
    "bfloat16-in-float32": (torch.bfloat16, torch.float32, ("thinker", "reference_voice",
                                                            "talker")),
}
STREAM_UNITS = 32  # crosses the encoder cache reset (30 s of 1500 positions) and the mel slide
REFERENCE_CLIPS = (16000 * 2 + 700, 9999, 16000 * 5 + 1599)  # none a multiple of 1600
TALKER_STEPS = 12
TOKENIZER_TEXTS = (
    "Hello, world! How are you today?",
    "你好，世界。今天天气怎么样？",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n",
    "<unit><|listen|></unit><|speak|>Sure.<|tts_bos|>OK<|chunk_eos|>",
    "Numbers 3.14, 2,718 and 1e-6; quotes \"a\" 'b' (c) [d] {e}!?",
    "Mixed 中文 and English, with emoji 🙂 and tabs\tand\nnewlines.",
    "  leading spaces and trailing  ",
    "<|audio_start|><|audio_end|>Repeat after me: ...",
    "You are a helpful assistant. Answer briefly.\n<|im_end|>\n",
    "Line one.\n\nLine two:  indented\n\t- item；全角标点！",
)


def tiny_config_kwargs() -> dict[str, Any]:
    """MiniCPMOConfig arguments: tiny widths, the real vocabulary, every module but vision."""
    return dict(
        vocab_size=151748, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
        rope_theta=1_000_000.0, max_position_embeddings=40960, tie_word_embeddings=False,
        bos_token_id=151643, eos_token_id=151645,
        init_vision=False, init_audio=True, init_tts=True,
        audio_config=dict(d_model=64, encoder_layers=2, encoder_attention_heads=4,
                          encoder_ffn_dim=256, max_source_positions=1500),
        tts_config=dict(llm_dim=64, hidden_size=32, intermediate_size=96, num_attention_heads=4,
                        num_key_value_heads=2, num_hidden_layers=2, num_audio_tokens=6562,
                        num_text_tokens=151748, audio_bos_token_id=151687,
                        text_eos_token_id=151692, normalize_projected_hidden=False,
                        condition_type="hidden_text_merge", attention_type="full_attention"),
    )


# The released MiniCPM-o 4.5 sizes: Qwen3-8B with the official tokenizer's 151748 ids,
# Whisper-medium's encoder, the 20 x 768 Talker over 6561 speech codes + EOS.
RELEASED_CONFIG: dict[str, Any] = dict(
    vocab_size=151748, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
    num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=1_000_000.0,
    max_position_embeddings=40960, init_vision=False,
    audio_config=dict(d_model=1024, encoder_layers=24, encoder_attention_heads=16,
                      encoder_ffn_dim=4096, max_source_positions=1500),
    tts_config=dict(llm_dim=4096, num_audio_tokens=6562, num_text_tokens=151748,
                    audio_bos_token_id=151687, text_eos_token_id=151692,
                    condition_type="hidden_text_merge"),
)


def import_official(official: Path) -> types.ModuleType:
    """The official folder as the package `minicpmo_official` (its modules import each other
    relatively); returns its modeling module."""
    package = types.ModuleType(PACKAGE)
    package.__path__ = [str(official)]
    sys.modules[PACKAGE] = package
    return importlib.import_module(f"{PACKAGE}.modeling_minicpmo")


def build_checkpoint(modeling: types.ModuleType, official: Path, out: Path, seed: int,
                     dtype: torch.dtype) -> None:
    config_module = sys.modules[f"{PACKAGE}.configuration_minicpmo"]
    config = config_module.MiniCPMOConfig(**tiny_config_kwargs())
    torch.manual_seed(seed)
    model = modeling.MiniCPMO(config)
    _randomize(model, seed)
    model.to(dtype).save_pretrained(str(out), safe_serialization=True, max_shard_size="4MB")
    for name in TOKENIZER_FILES:
        shutil.copyfile(official / name, out / name)


def _randomize(model: torch.nn.Module, seed: int) -> None:
    """Every tensor non-trivial (norm scales away from one, biases away from zero), so a
    missed scale or bias shows in the outputs."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            noise = torch.randn(param.shape, generator=gen)
            if param.dim() == 1 and ("norm" in name or name.endswith("original0")):
                param.copy_(1.0 + 0.1 * noise)
            elif param.dim() == 1:
                param.copy_(0.05 * noise)
            elif name.endswith("original0"):
                param.copy_((1.0 + 0.1 * noise).abs())
            else:
                fan_in = param.shape[-1] if param.dim() == 2 else param[0].numel()
                scale = 0.5 if "emb" in name else fan_in ** -0.5
                param.copy_(scale * noise)


@dataclass
class Official:
    modeling: types.ModuleType
    model: Any  # MiniCPMO
    tokenizer: Any
    processor: Any  # MiniCPMOProcessor
    rng: np.random.Generator


def load_official(modeling: types.ModuleType, official: Path, ckpt: Path, dtype: torch.dtype,
                  seed: int) -> Official:
    processing = sys.modules[f"{PACKAGE}.processing_minicpmo"]
    tokenization = importlib.import_module(f"{PACKAGE}.tokenization_minicpmo_fast")
    tokenizer = tokenization.MiniCPMOTokenizerFast.from_pretrained(str(ckpt))
    model = modeling.MiniCPMO.from_pretrained(str(ckpt), torch_dtype=dtype,
                                              attn_implementation="sdpa").eval()
    # What MiniCPMOProcessor.from_pretrained builds from the official preprocessor_config.json
    # (the audio extractor takes Whisper's defaults), without loading code from the checkpoint.
    settings = json.loads((official / "preprocessor_config.json").read_text(encoding="utf-8"))
    processor = processing.MiniCPMOProcessor(
        image_processor=processing.MiniCPMVImageProcessor(**settings),
        audio_processor=processing.MiniCPMAAudioProcessor(),
        tokenizer=tokenizer, audio_pool_step=settings["audio_pool_step"],
    )
    model.processor = processor
    return Official(modeling, model, tokenizer, processor, np.random.default_rng(seed))


def ref_tokenizer(o: Official) -> dict[str, Any]:
    texts = list(TOKENIZER_TEXTS)
    ids = [o.tokenizer.encode(t, add_special_tokens=False) for t in texts]
    return {"texts": texts, "ids": ids, "len": len(o.tokenizer),
            "decoded": [o.tokenizer.decode(i) for i in ids],
            "decoded_skip_special": [o.tokenizer.decode(i, skip_special_tokens=True) for i in ids],
            "bad_token_ids": list(o.tokenizer.bad_token_ids)}


def ref_thinker(o: Official) -> dict[str, Any]:
    """Logits of the last rows of a prompt mixing text, special tokens and random ids."""
    text = o.tokenizer.encode("<|im_start|>system\n你好, speak.<|im_end|><unit>",
                              add_special_tokens=False)
    ids = np.array(text + o.rng.integers(0, 151748, 20).tolist(), dtype=np.int64)
    with torch.no_grad():
        logits = o.model.llm(input_ids=torch.from_numpy(ids)[None]).logits[0, -6:]
    return {"input_ids": ids, "logits": logits.float().numpy()}


def ref_streaming_audio(o: Official) -> dict[str, Any]:
    """The duplex streaming audio path (`MiniCPMODuplex.streaming_prefill`'s audio step) over
    STREAM_UNITS one-second units: mel in the processor's exact mode, the streaming encoder with
    its KV cache, projector and pool."""
    audio = _voice_like(o.rng, STREAM_UNITS * 16000)
    model = o.model
    model.CNN_REDUNDANCY_MS = 20  # MiniCPMODuplex's default, set before the processor is made
    model.init_streaming_processor()
    model.audio_past_key_values = None
    buffer, rows, first_ms = np.zeros(0, np.float32), [], model.FIRST_CHUNK_MS
    for unit in range(STREAM_UNITS):
        buffer = np.concatenate([buffer, audio[unit * 16000:(unit + 1) * 16000]])
        if unit == 0:
            required = int(first_ms * 16000 / 1000)
            buffer = np.concatenate([np.zeros(max(0, required - len(buffer)), np.float32), buffer])
        need = o.processor.get_streaming_chunk_size()
        feature = o.processor.process_audio_streaming(buffer[:need], reset=False,
                                                      return_batch_feature=True)
        feature = feature.to("cpu")
        feature["audio_features"] = feature["audio_features"].to(model.apm.conv1.weight.dtype)
        with torch.no_grad():
            nested = model.get_audio_embedding_streaming(
                feature, use_extra_context=True, prefix_extra_frames=0 if unit == 0 else 2,
                suffix_extra_frames=2)
        rows.append(torch.cat([t for g in nested for t in g]).float().numpy())
        if unit == 0:
            cfg = o.processor._streaming_mel_processor.get_config()
            consumed = int(int(cfg.get("effective_first_chunk_ms", first_ms)) * 16000 / 1000)
        else:
            consumed = 16000
        buffer = buffer[consumed:]
    return {"audio": audio, "rows": np.stack(rows)}


def ref_reference_voice(o: Official) -> dict[str, Any]:
    """`MiniCPMODuplex.prepare`'s reference clip rows: process_audio, then the non-streaming
    encoder with the config's chunk length."""
    out: dict[str, Any] = {"lengths": list(REFERENCE_CLIPS)}
    for i, length in enumerate(REFERENCE_CLIPS):
        clip = _voice_like(o.rng, length)
        data = o.processor.process_audio([clip])
        data["audio_features"] = data["audio_features"].to(o.model.apm.conv1.weight.dtype)
        with torch.no_grad():
            nested = o.model.get_audio_embedding(
                data, chunk_length=o.model.config.audio_chunk_length)
        out[f"clip{i}"] = clip
        out[f"rows{i}"] = torch.cat([t for g in nested for t in g]).float().numpy()
    return out


def ref_talker(o: Official) -> dict[str, Any]:
    """The duplex Talker condition (`MiniCPMODuplex._convert_results_to_tts_input`), then
    `MiniCPMTTS.generate_chunk` with its draw made greedy; records every step's logits."""
    tts = o.model.tts
    llm_dim = o.model.config.hidden_size
    ids = o.rng.integers(0, 151748, 7).astype(np.int64)
    hidden = o.rng.standard_normal((7, llm_dim)).astype(np.float32)
    dtype = tts.emb_text.weight.dtype
    results = [(int(t), torch.from_numpy(h)[None, None].to(dtype)) for t, h in zip(ids, hidden)]
    duplex = types.SimpleNamespace(model=o.model, device="cpu")
    with torch.no_grad():
        condition = o.modeling.MiniCPMODuplex._convert_results_to_tts_input(duplex, results)
        with _greedy_draws(tts.num_audio_tokens) as logits:
            codes, _ = tts.generate_chunk(
                condition, temperature=torch.tensor([1.0]), repetition_penalty=1.0,
                eos_token=torch.tensor([tts.num_audio_tokens - 1]), force_no_stop=True,
                max_new_token=TALKER_STEPS, text_start_pos=0)
    return {"ids": ids, "hidden": hidden, "condition": condition[0].float().numpy(),
            "logits": torch.cat(logits).float().numpy(), "codes": codes[0, :, 0].numpy()}


def ref_released_shapes(o: Official) -> dict[str, Any]:
    """Every tensor's shape in the released model's layout, as the official classes build it
    from the released sizes (no memory: the meta device)."""
    config_module = sys.modules[f"{PACKAGE}.configuration_minicpmo"]
    config = config_module.MiniCPMOConfig(**RELEASED_CONFIG)
    with torch.device("meta"):
        model = o.modeling.MiniCPMO(config)
    return {"shapes": {name: list(t.shape) for name, t in model.state_dict().items()}}


@contextmanager
def _greedy_draws(num_codes: int) -> Iterator[list[torch.Tensor]]:
    """Inside: softmax records the [1, num_codes] rows it gets (the codec logits; attention
    softmax passes untouched) and multinomial takes the argmax, so the official loop decodes
    greedily with nothing else changed."""
    seen: list[torch.Tensor] = []
    softmax, multinomial = F.softmax, torch.multinomial

    def recording_softmax(x: torch.Tensor, *args: Any, **kw: Any) -> torch.Tensor:
        if x.dim() == 2 and x.shape[-1] == num_codes:
            seen.append(x.detach().clone())
        return softmax(x, *args, **kw)

    F.softmax = recording_softmax
    torch.multinomial = lambda scores, num_samples, **kw: scores.argmax(-1, keepdim=True)
    try:
        yield seen
    finally:
        F.softmax, torch.multinomial = softmax, multinomial


def _voice_like(rng: np.random.Generator, n: int) -> np.ndarray:
    """Speech-band tones with a syllable envelope and noise: a mel that moves."""
    t = np.arange(n) / 16000.0
    f0 = 110 + 40 * rng.random()
    tone = sum(np.sin(2 * np.pi * k * f0 * t + rng.random() * 6) / k for k in range(1, 8))
    env = np.sin(np.pi * 4.0 * t) ** 2
    return (0.3 * tone * env + 0.02 * rng.standard_normal(n)).astype(np.float32)


DUPLEX_UNITS = 10  # greedy duplex units of the streaming loop (3 forced to listen)
DUPLEX_FORCE_LISTEN = 3
# prompt cases: (instructions, clip) -- "clip": a session's REF_AUDIO; "default": the default
# voice the demo feeds when none is given; "none": prepare without ref_audio
DUPLEX_PROMPTS = (
    ("You are a helpful assistant.", "clip"),
    ("Streaming Duplex Conversation! You are a helpful assistant", "default"),
    ("说中文。回答要简短", "none"),
)


def _official_duplex(o: Official, force_listen_count: int) -> Any:
    """A `MiniCPMODuplex` over the loaded model, its attributes set as its `__init__` sets them
    with the official defaults, text only (`generate_audio=False`: no Talker or token2wav), so
    its own `prepare`, `streaming_prefill` and `streaming_generate` run unchanged."""
    import threading

    utils = sys.modules[f"{PACKAGE}.utils"]
    # as a freshly loaded model: `prepare` leaves the streaming audio encoder's KV cache of an
    # earlier session (or reference) in place, so each case starts from a reset one
    o.model.reset_session(reset_token2wav_cache=True)
    duplex = object.__new__(o.modeling.MiniCPMODuplex)
    tok = o.tokenizer
    duplex.__dict__.update(
        session_logs=[], session_start_time=None, log_file_path=None, name_or_path="",
        generate_audio=False, ls_mode="explicit", device="cpu", processor=o.processor,
        tokenizer=tok, model=o.model, break_event=threading.Event(),
        session_stop_event=threading.Event(), max_new_speak_tokens_per_chunk=20,
        text_repetition_penalty=1.05, temperature=0.7, top_k=20, top_p=0.8,
        text_repetition_window_size=512, listen_prob_scale=1.0,
        force_listen_count=force_listen_count, tts_temperature=None, tts_repetition_penalty=1.05,
        CHUNK_MS=1000, FIRST_CHUNK_MS=1035, CNN_REDUNDANCY_MS=20, SAMPLE_RATE=16000,
        tts_logits_processors=None, tts_eos_token=None)
    for name in ("CHUNK_MS", "FIRST_CHUNK_MS", "CNN_REDUNDANCY_MS", "SAMPLE_RATE"):
        setattr(o.model, name, getattr(duplex, name))
    ids = {name: tok.convert_tokens_to_ids(token) for name, token in (
        ("unit_token_id", "<unit>"), ("image_start_token_id", "<image>"),
        ("image_end_token_id", "</image>"), ("slice_start_token_id", "<slice>"),
        ("slice_end_token_id", "</slice>"), ("listen_token_id", "<|listen|>"),
        ("speak_token_id", "<|speak|>"), ("tts_bos_token_id", "<|tts_bos|>"),
        ("tts_eos_token_id", "<|tts_eos|>"), ("chunk_eos_token_id", "<|chunk_eos|>"),
        ("chunk_tts_eos_token_id", "<|chunk_tts_eos|>"), ("turn_eos_token_id", "<|turn_eos|>"),
        ("tts_pad_id", "<|tts_pad|>"))}
    duplex.__dict__.update(ids)
    duplex.chunk_terminator_token_ids = [ids["listen_token_id"], ids["chunk_eos_token_id"],
                                         ids["chunk_tts_eos_token_id"]]
    duplex.turn_terminator_token_ids = [ids["turn_eos_token_id"]]
    duplex.chunk_speak_token_ids = [ids["speak_token_id"]]
    duplex.forbidden_token_ids = [ids["tts_pad_id"]] + list(getattr(tok, "bad_token_ids", []))
    duplex.decoder = utils.StreamDecoder(llm=o.model.llm, tokenizer=tok,
                                         forbidden_token_ids=duplex.forbidden_token_ids)
    duplex.decoder.set_window_config(utils.DuplexWindowConfig())
    duplex.decoder.set_window_enabled(False)
    duplex._reset_streaming_state()
    return duplex


def _prepare(o: Official, duplex: Any, instructions: str, clip: np.ndarray | None) -> None:
    """The demo's prompt: `<|im_start|>system\n{instructions}\n<|audio_start|>`, the clip,
    `<|audio_end|><|im_end|>`."""
    duplex.prepare(prefix_system_prompt=f"<|im_start|>system\n{instructions}\n<|audio_start|>",
                   suffix_system_prompt="<|audio_end|><|im_end|>", ref_audio=clip)


def _decisions(o: Official, logits: np.ndarray) -> dict[str, Any]:
    """`StreamDecoder.decode` (greedy) of rows made from real decision logits so that each
    rule decides: the listen scale (on the tokenizer's EOS id), the turn_eos length penalty,
    the repetition penalty over a history, the bad_token_ids mask."""
    utils = sys.modules[f"{PACKAGE}.utils"]
    tok = o.tokenizer
    eos, turn_eos = tok.eos_token_id, tok.convert_tokens_to_ids("<|turn_eos|>")
    top = int(np.argmax(logits))
    low = int(np.argsort(logits)[len(logits) // 3])
    bad = int(tok.bad_token_ids[len(tok.bad_token_ids) // 2])
    near = logits.max() - 0.05
    cases = []  # (row, listen_prob_scale, history)
    for scale in (1.0, 1.5):
        row = logits.copy()
        row[eos] = near
        cases.append((row, scale, []))
    row = logits.copy()
    row[turn_eos] = logits.max() + 0.05
    cases.append((row, 1.0, []))
    row = logits - (logits.max() + 1.0)  # every logit negative, the largest -1
    row[low] = -1.04  # -0.990 once penalised: ahead of the largest only if divided
    cases.append((row, 1.0, [low]))
    row = logits.copy()
    row[bad] = logits.max() + 1.0
    cases.append((row, 1.0, [top]))
    rows, scales, histories, picks = [], [], [], []
    for row, scale, history in cases:
        decoder = utils.StreamDecoder(llm=o.model.llm, tokenizer=tok, forbidden_token_ids=[
            tok.convert_tokens_to_ids("<|tts_pad|>")] + list(tok.bad_token_ids))
        decoder.generated_tokens = list(history)
        picked = decoder.decode(torch.from_numpy(row)[None], mode="greedy", listen_prob_scale=scale)
        rows.append(row)
        scales.append(scale)
        histories.append(history)
        picks.append(int(picked.item()))
    return {"decision_rows": np.stack(rows), "decision_scales": scales,
            "decision_histories": histories, "decision_picks": picks}


def ref_duplex(o: Official) -> dict[str, Any]:
    """The duplex prompt (prefix ids, reference rows, suffix ids) and the first unit's decision
    logits per DUPLEX_PROMPTS case, then a greedy run of the official streaming loop
    (`streaming_prefill` + `streaming_generate(decode_mode="greedy")`) over DUPLEX_UNITS units."""
    audio = _voice_like(o.rng, DUPLEX_UNITS * 16000)
    clips = {"clip": _voice_like(o.rng, 16000 * 2 + 333), "default": _voice_like(o.rng, 16000 * 3 + 77)}
    out: dict[str, Any] = {"audio": audio, "clip": clips["clip"], "default": clips["default"],
                           "prompts": [list(case) for case in DUPLEX_PROMPTS]}
    for i, (instructions, kind) in enumerate(DUPLEX_PROMPTS):
        duplex = _official_duplex(o, 0)
        _prepare(o, duplex, instructions, clips.get(kind))
        tok = o.tokenizer
        out[f"prefix_ids{i}"] = tok.encode(f"<|im_start|>system\n{instructions}\n<|audio_start|>",
                                           add_special_tokens=False)
        out[f"suffix_ids{i}"] = tok.encode("<|audio_end|><|im_end|>", add_special_tokens=False)
        out[f"prompt_len{i}"] = duplex.decoder.get_cache_length()
        if kind in clips:
            data = o.processor.process_audio([clips[kind]])
            with torch.no_grad():
                nested = o.model.get_audio_embedding(data, chunk_length=o.model.config.audio_chunk_length)
            out[f"ref_rows{i}"] = torch.cat([t for g in nested for t in g]).float().numpy()
        with torch.no_grad():
            assert duplex.streaming_prefill(audio_waveform=audio[:16000])["success"]
        out[f"first_logits{i}"] = duplex.pending_logits[0].float().numpy()
    out.update(_decisions(o, out["first_logits0"]))
    duplex = _official_duplex(o, DUPLEX_FORCE_LISTEN)
    _prepare(o, duplex, DUPLEX_PROMPTS[0][0], clips["clip"])
    units: list[list[int]] = []
    listens, texts = [], []
    for unit in range(DUPLEX_UNITS):
        start = len(duplex.total_ids)
        with torch.no_grad():
            assert duplex.streaming_prefill(audio_waveform=audio[unit * 16000:(unit + 1) * 16000])["success"]
            result = duplex.streaming_generate(decode_mode="greedy")
        units.append(duplex.total_ids[start:-1])  # the unit's tokens, </unit> left out
        listens.append(bool(result["is_listen"]))
        texts.append(result["text"])
    out.update(run_units=units, run_listen=listens, run_text=texts)
    return out


REFERENCES: dict[str, Callable[[Official], dict[str, Any]]] = {
    "tokenizer": ref_tokenizer,
    "thinker": ref_thinker,
    "streaming_audio": ref_streaming_audio,
    "reference_voice": ref_reference_voice,
    "talker": ref_talker,
    "released_shapes": ref_released_shapes,
    "duplex": ref_duplex,
}


def write_reference(out: Path, name: str, values: dict[str, Any]) -> None:
    arrays = {k: v for k, v in values.items() if isinstance(v, np.ndarray)}
    rest = {k: v for k, v in values.items() if not isinstance(v, np.ndarray)}
    np.savez(out / f"{name}.npz", **arrays)
    (out / f"{name}.json").write_text(json.dumps(rest, ensure_ascii=False), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--official", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    modeling = import_official(args.official.resolve())
    for variant, (stored, computed, names) in VARIANTS.items():
        ckpt = args.out / f"ckpt-{str(stored).removeprefix('torch.')}"
        if not ckpt.is_dir():
            ckpt.mkdir(parents=True)
            build_checkpoint(modeling, args.official, ckpt, args.seed, stored)
        official = load_official(modeling, args.official, ckpt, computed, args.seed)
        for name in names:
            official.rng = np.random.default_rng([args.seed, zlib.crc32(name.encode())])
            write_reference(args.out, f"{name}-{variant}", REFERENCES[name](official))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
