"""Session parameters sent as Triton request parameters on the START request."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SessionParams:
    instructions: str | None = None  # system prompt
    initial_user_text: str | None = None  # opens the session with a text user turn
    temperature: float | None = None  # None: the server's default (0.7); 0: greedy
    seed: int | None = None
    # Policy knobs: force the reply shape, so random-weight models still answer.
    reply_units: int | None = None  # length of each reply in 1 s units
    reply_tokens_per_unit: int | None = None
    voice: str | None = None  # a server-side voice name
    force_listen_count: int | None = None  # first N units of each turn are forced to listen
    # The official duplex decoding settings (None: the server's default, the official one).
    top_k: int | None = None
    top_p: float | None = None
    max_new_speak_tokens_per_chunk: int | None = None
    listen_prob_scale: float | None = None
    length_penalty: float | None = None  # on <|turn_eos|>: > 1 makes replies longer
    text_repetition_penalty: float | None = None
    text_repetition_window_size: int | None = None
    listen_when_silent: bool | None = None  # option: listen on silent units with nothing to answer
    # The Thinker's context: what happens when it fills (off | basic | context) and where it
    # fills (a session's KV limit, at most the server's reservation).
    sliding_window_mode: str | None = None
    max_kv_tokens: int | None = None
    tts_enabled: bool | None = None  # False: text-only replies (the server skips the speech stages)
    max_reply_tokens: int | None = None  # option: a reply ends after this many text tokens

    def __post_init__(self) -> None:
        self._check_policy()
        self._check_decoding()

    def _check_policy(self) -> None:
        if self.temperature is not None and not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.seed is not None and self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if self.reply_units is not None and self.reply_units < 1:
            raise ValueError(f"reply_units must be >= 1, got {self.reply_units}")
        if self.reply_tokens_per_unit is not None and self.reply_tokens_per_unit < 1:
            raise ValueError(
                f"reply_tokens_per_unit must be >= 1, got {self.reply_tokens_per_unit}"
            )
        if self.force_listen_count is not None and self.force_listen_count < 0:
            raise ValueError(f"force_listen_count must be >= 0, got {self.force_listen_count}")

    def _check_decoding(self) -> None:
        at_least = {"top_k": 1, "max_new_speak_tokens_per_chunk": 2, "text_repetition_window_size": 1,
                    "max_kv_tokens": 1, "max_reply_tokens": 1}
        for name, low in at_least.items():
            value = getattr(self, name)
            if value is not None and value < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        for name in ("top_p", "listen_prob_scale", "length_penalty", "text_repetition_penalty"):
            value = getattr(self, name)
            if value is not None and not value > 0.0:
                raise ValueError(f"{name} must be > 0, got {value}")

    def to_parameters(self) -> dict[str, str | int | float | bool]:
        """The Triton request parameters of the START request (unset fields are left out).

        tritonclient sends str/int/float/bool as string/int64/double/bool parameters.
        """
        floats = ("top_p", "listen_prob_scale", "length_penalty", "text_repetition_penalty")
        values: dict[str, str | int | float | bool | None] = {
            "instructions": self.instructions,
            "initial_user_text": self.initial_user_text,
            "temperature": None if self.temperature is None else float(self.temperature),
            "seed": self.seed,
            "reply_units": self.reply_units,
            "reply_tokens_per_unit": self.reply_tokens_per_unit,
            "voice": self.voice,
            "force_listen_count": self.force_listen_count,
            "top_k": self.top_k,
            "max_new_speak_tokens_per_chunk": self.max_new_speak_tokens_per_chunk,
            "text_repetition_window_size": self.text_repetition_window_size,
            "listen_when_silent": self.listen_when_silent,
            "sliding_window_mode": self.sliding_window_mode,
            "max_kv_tokens": self.max_kv_tokens,
            "tts_enabled": self.tts_enabled,
            "max_reply_tokens": self.max_reply_tokens,
            **{name: None if getattr(self, name) is None else float(getattr(self, name)) for name in floats},
        }
        return {key: value for key, value in values.items() if value is not None}
