"""Decoder backbones driven by the runner (Qwen3 Thinker, Llama Talker), HF parameter names."""
