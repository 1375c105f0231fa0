"""Deployment profiles: the values rendered into every `config.pbtxt.tmpl`.

One table of variables (README "Configuration variables") shared by all four models.
`cpu` is the profile the committed `config.pbtxt` files are rendered from, so the
repository also loads as committed.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

KINDS = ("KIND_CPU", "KIND_GPU")


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    instance_kind: str = "KIND_CPU"
    device: str = "cpu"  # torch device of the stage runners: cpu | cuda
    dtype: str = "float32"  # runner dtype: float32 | bfloat16
    checkpoint: str = "tiny"  # tiny | full-random | an absolute checkpoint directory
    thinker_gpus: str = ""  # e.g. "0"; empty for CPU
    talker_gpus: str = ""
    code2wav_gpus: str = ""
    max_sessions: int = 4  # admission limit of the duplex orchestrator
    idle_timeout_s: int = 60  # a session with no uplink request for this long is reaped
    max_append_ms: int = 10000  # largest accepted AUDIO append
    max_context_tokens: int = 8192  # Thinker KV reserved per session (window off)
    talker_context_tokens: int = 4096

    def __post_init__(self) -> None:
        if self.instance_kind not in KINDS:
            raise ValueError(f"instance_kind must be one of {KINDS}, got {self.instance_kind!r}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {self.device!r}")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype must be float32 or bfloat16, got {self.dtype!r}")
        for name in ("max_sessions", "idle_timeout_s", "max_append_ms", "max_context_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    def template_vars(self) -> dict[str, str]:
        values = {f.name: str(getattr(self, f.name)) for f in dataclasses.fields(self)}
        for stage in ("thinker", "talker", "code2wav"):
            gpus = getattr(self, f"{stage}_gpus")
            values[f"{stage}_gpus_clause"] = f"gpus: [ {gpus} ]" if gpus else ""
        # More sequence slots than sessions: a START over the limit must reach our admission
        # check (and be refused at once) instead of waiting in Triton's silent backlog.
        values["sequence_slots"] = str(4 * self.max_sessions + 16)
        # Triton's own idle reaper must fire after ours, which answers the client.
        values["sequence_idle_us"] = str((self.idle_timeout_s + 30) * 1_000_000)
        return values

    def with_overrides(self, overrides: dict[str, str]) -> "Profile":
        fields = {f.name: f for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - set(fields))
        if unknown:
            raise ValueError(f"unknown configuration variables {unknown}; known: {sorted(fields)}")
        typed = {k: type(getattr(self, k))(v) for k, v in overrides.items()}
        return dataclasses.replace(self, **typed)


PROFILES: dict[str, Profile] = {
    "cpu": Profile(name="cpu"),
    "gpu": Profile(
        name="gpu", instance_kind="KIND_GPU", device="cuda", dtype="bfloat16",
        checkpoint="full-random", thinker_gpus="0", talker_gpus="0", code2wav_gpus="0",
        max_sessions=32, max_context_tokens=16384,
    ),
}


def get_profile(name: str) -> Profile:
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; choose one of {sorted(PROFILES)}")
    return PROFILES[name]
