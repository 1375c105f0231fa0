"""Usage of one session, in the shape the Realtime SDK's UsageEvent reads (input_tokens,
output_tokens, total_tokens, input_tokens_details.audio_tokens, output_tokens_details.audio_tokens).

Counted from the duplex contract's facts, not from the model:
- input audio tokens: 10 per 1-second unit the server cuts from the forwarded audio
  (docs/model_facts.md, "Rates": 10 Thinker audio embeddings per unit);
- output audio tokens: 25 per second of reply audio (the Talker's 25 Hz codec frames);
- output text tokens: the `n_tokens` field of `response.text.delta` (the tokens the Thinker
  sampled in that unit; docs/gateway.md, "Usage").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backends.gateway.audio import INPUT_SAMPLE_RATE, OUTPUT_SAMPLE_RATE

AUDIO_TOKENS_PER_UNIT = 10
CODEC_FRAMES_PER_S = 25


@dataclass
class Usage:
    input_samples: int = 0
    output_samples: int = 0
    text_tokens: int = 0

    def add_input(self, samples: int) -> None:
        self.input_samples += samples

    def add_output_audio(self, samples: int) -> None:
        self.output_samples += samples

    def add_text(self, fields: dict[str, Any]) -> None:
        count = fields.get("n_tokens")
        if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
            self.text_tokens += count

    @property
    def input_audio_tokens(self) -> int:
        return self.input_samples // INPUT_SAMPLE_RATE * AUDIO_TOKENS_PER_UNIT

    @property
    def output_audio_tokens(self) -> int:
        return self.output_samples * CODEC_FRAMES_PER_S // OUTPUT_SAMPLE_RATE

    def as_json(self) -> dict[str, Any]:
        inputs, outputs = self.input_audio_tokens, self.text_tokens + self.output_audio_tokens
        return {
            "input_tokens": inputs, "output_tokens": outputs, "total_tokens": inputs + outputs,
            "input_tokens_details": {"audio_tokens": inputs, "text_tokens": 0},
            "output_tokens_details": {"audio_tokens": self.output_audio_tokens, "text_tokens": self.text_tokens},
        }
