"""Session parameters sent as Triton request parameters on the START request."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SessionParams:
    instructions: str | None = None  # system prompt
    initial_user_text: str | None = None  # opens the session with a text user turn
    temperature: float | None = None  # None: the server's default
    seed: int | None = None
    # Policy knobs: force the reply shape, so random-weight models still answer.
    reply_units: int | None = None  # length of each reply in 1 s units
    reply_tokens_per_unit: int | None = None
    voice: str | None = None  # a server-side voice name
    force_listen_count: int | None = None  # first N units of each turn are forced to listen

    def __post_init__(self) -> None:
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

    def to_parameters(self) -> dict[str, str | int | float]:
        """The Triton request parameters of the START request (unset fields are left out).

        tritonclient sends str/int/float as string/int64/double parameters.
        """
        values: dict[str, str | int | float | None] = {
            "instructions": self.instructions,
            "initial_user_text": self.initial_user_text,
            "temperature": None if self.temperature is None else float(self.temperature),
            "seed": self.seed,
            "reply_units": self.reply_units,
            "reply_tokens_per_unit": self.reply_tokens_per_unit,
            "voice": self.voice,
            "force_listen_count": self.force_listen_count,
        }
        return {key: value for key, value in values.items() if value is not None}
