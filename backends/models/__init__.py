"""The networks, with HF parameter names: the decoder backbones the runner drives (Qwen3
Thinker, Llama Talker; each implements backends/runner/backbone.py), the Whisper log-mel and
encoder, the projector, the Talker and token2wav."""
