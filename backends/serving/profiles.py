"""Deployment profiles: the values rendered into every `config.pbtxt.tmpl`.

One table of variables (deploy/README.md "Configuration variables") shared by all models;
`minicpmo-server --profile NAME --set VAR=VALUE` picks a profile and overrides any variable.
`cpu` is the profile the committed `config.pbtxt` files are rendered from, so the
repository also loads as committed.

Placement: each stage (thinker, talker, code2wav) is ONE model instance on one device,
because its engine keeps per-session state (KV, encoder and vocoder caches) that a second
instance would not see; the engine batches across sessions instead. What scales out is the
`duplex` orchestrator (instances share the sessions through the sequence batcher) and, past
one server, replicas behind a load balancer (deploy/README.md "Scale-out").
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from backends.serving.fault_injection import SETTINGS as FAULT_SETTINGS

if TYPE_CHECKING:
    from backends.serving.memory_plan import MemoryPlan

GIB = 1 << 30

KINDS = ("KIND_CPU", "KIND_GPU")
STAGES = ("thinker", "talker", "code2wav")
# Per-GPU share of the stage caps: the rest is the stages' CUDA contexts (about 0.5 GiB each)
# and the driver's reserves.
MAX_GPU_SHARE = 0.95
# Sequence slots of each `duplex` instance beyond its sessions: STARTs being refused at once.
# A refusal frees its slot within a round trip (backends/duplex/refusals.py), so a START past
# all slots waits in Triton's backlog only that long; never for a session to end.
REFUSAL_SLOTS = 28


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    instance_kind: str = "KIND_CPU"
    device: str = "cpu"  # torch device of the stage runners: cpu | cuda
    dtype: str = "float32"  # runner dtype: float32 | bfloat16
    checkpoint: str = "tiny"  # tiny | full-random | an absolute checkpoint directory
    thinker_gpus: str = ""  # GPU id of the stage's one instance; empty on CPU
    talker_gpus: str = ""
    code2wav_gpus: str = ""
    # cap of the stage's torch allocator (share of its GPU); 0 = none, or the memory plan's share
    # where gpu_memory_gib is set (an explicit value overrides the plan)
    thinker_memory_fraction: float = 0.0
    talker_memory_fraction: float = 0.0
    code2wav_memory_fraction: float = 0.0
    # memory of the stages' one GPU as torch reports it (GiB); > 0: the shares come from the plan
    # (backends/serving/memory_plan.py), and a profile that does not fit fails to render
    gpu_memory_gib: float = 0.0
    duplex_instances: int = 1  # orchestrator processes; sessions are spread over them
    max_sessions: int = 4  # sessions of the whole server (admission limit; stage engines are sized for it)
    idle_timeout_s: int = 60  # a session with no uplink request for this long is reaped
    max_append_ms: int = 10000  # largest accepted AUDIO append
    max_uplink_ahead_s: int = 5  # uplink audio a session may run ahead of real time and of the model
    max_context_tokens: int = 8192  # Thinker KV reserved per session (window off)
    talker_context_tokens: int = 4096
    # the Thinker's sliding window for sessions that do not choose: off | basic | context
    sliding_window_mode: str = "off"
    fault_injection: str = "off"  # test-only: `on` makes stage requests marked fault-<stage> fail
    # Code2Wav streams from each session's REF_AUDIO voice (on) or always the default voice (off)
    session_voices: str = "on"
    # ms Code2Wav holds the windows that can wait once a reply's first window is announced (0: never)
    code2wav_first_hold_ms: int = 50
    # Code2Wav cache-pool slots: replies decoding at once (a reply beyond them waits for one);
    # 0: two per session, so every session can speak, a barge-in's old reply still ending
    code2wav_streams: int = 0

    def __post_init__(self) -> None:
        if self.instance_kind not in KINDS:
            raise ValueError(f"instance_kind must be one of {KINDS}, got {self.instance_kind!r}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {self.device!r}")
        if (self.device == "cuda") != (self.instance_kind == "KIND_GPU"):
            raise ValueError(f"device {self.device!r} does not match instance_kind {self.instance_kind!r} "
                             "(cuda goes with KIND_GPU, cpu with KIND_CPU)")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype must be float32 or bfloat16, got {self.dtype!r}")
        if self.sliding_window_mode not in ("off", "basic", "context"):
            raise ValueError(f"sliding_window_mode must be off, basic or context, got {self.sliding_window_mode!r}")
        if self.session_voices not in ("on", "off"):
            raise ValueError(f"session_voices must be on or off, got {self.session_voices!r}")
        if self.fault_injection not in FAULT_SETTINGS:
            raise ValueError(f"fault_injection must be one of {FAULT_SETTINGS}, got {self.fault_injection!r}")
        if self.code2wav_streams < 0:
            raise ValueError(f"code2wav_streams must be 0 (two per session) or positive, got {self.code2wav_streams}")
        if not 0 <= self.code2wav_first_hold_ms <= 1000:
            raise ValueError(f"code2wav_first_hold_ms must lie in [0, 1000], got {self.code2wav_first_hold_ms}")
        for name in ("duplex_instances", "max_sessions", "idle_timeout_s", "max_append_ms", "max_uplink_ahead_s",
                     "max_context_tokens", "talker_context_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_sessions % self.duplex_instances:
            raise ValueError(f"max_sessions ({self.max_sessions}) must be a multiple of duplex_instances "
                             f"({self.duplex_instances}): each instance admits an equal share")
        self._check_placement()

    def memory_fractions(self) -> dict[str, float]:
        """Each stage's allocator cap: the profile's value, else the memory plan's share."""
        explicit = {stage: getattr(self, f"{stage}_memory_fraction") for stage in STAGES}
        if self.gpu_memory_gib <= 0 or all(explicit.values()):
            return explicit
        planned = self.memory_plan().shares()
        return {stage: explicit[stage] or planned[stage] for stage in STAGES}

    def memory_plan(self) -> "MemoryPlan":
        """The plan of this profile's one GPU; MemoryPlanError when the stages do not fit."""
        from backends.serving.memory_plan import full_random_inputs, planned_shares, plan

        if self.checkpoint != "full-random" and not self.checkpoint.startswith("/"):
            raise ValueError(f"gpu_memory_gib plans the released sizes: checkpoint must be full-random or a "
                             f"directory, got {self.checkpoint!r}")
        if self.instance_kind != "KIND_GPU" or len({self.stage_gpu(stage) for stage in STAGES}) != 1:
            raise ValueError("gpu_memory_gib plans one GPU holding every stage")
        inputs = full_random_inputs(self.max_sessions, self.max_context_tokens, self.talker_context_tokens,
                                    2 if self.dtype == "bfloat16" else 4, self.code2wav_streams)
        device_bytes = round(self.gpu_memory_gib * GIB)
        planned_shares(inputs, device_bytes)  # raises naming the largest session count that fits
        return plan(inputs, device_bytes)

    def _check_placement(self, fractions: dict[str, float] | None = None) -> None:
        """The stages' caps per GPU; the plan's shares are checked where they are computed
        (template_vars, at render), so a profile whose plan does not fit still imports."""
        share: dict[int, float] = {}
        fractions = fractions or {stage: getattr(self, f"{stage}_memory_fraction") for stage in STAGES}
        for stage in STAGES:
            gpu, fraction = self.stage_gpu(stage), fractions[stage]
            if not 0.0 <= fraction <= 1.0:
                raise ValueError(f"{stage}_memory_fraction must be in [0, 1], got {fraction}")
            if gpu is None and fraction:
                raise ValueError(f"{stage}_memory_fraction applies to GPU stages only, got {fraction} on CPU")
            if gpu is not None:
                share[gpu] = share.get(gpu, 0.0) + fraction
        for gpu, total in sorted(share.items()):
            if total > MAX_GPU_SHARE + 1e-9:
                raise ValueError(f"memory fractions of the stages on GPU {gpu} add up to {total:.2f}, "
                                 f"over {MAX_GPU_SHARE}")

    def stage_gpu(self, stage: str) -> int | None:
        """The GPU id of a stage's one instance; None on CPU. Raises on a malformed value."""
        text = getattr(self, f"{stage}_gpus").strip()
        if self.instance_kind == "KIND_CPU":
            if text:
                raise ValueError(f"{stage}_gpus must be empty with KIND_CPU, got {text!r}")
            return None
        if not text.isdigit():
            raise ValueError(f"{stage}_gpus must be one GPU id (a stage is one instance: its engine holds the "
                             f"sessions' state), got {text!r}")
        return int(text)

    @property
    def sessions_per_duplex_instance(self) -> int:
        return self.max_sessions // self.duplex_instances

    def template_vars(self) -> dict[str, str]:
        values = {f.name: str(getattr(self, f.name)) for f in dataclasses.fields(self)}
        fractions = self.memory_fractions()  # MemoryPlanError when a planned profile does not fit
        self._check_placement(fractions)
        values.update({f"{stage}_memory_fraction": str(v) for stage, v in fractions.items()})
        for stage in STAGES:
            gpu = self.stage_gpu(stage)
            values[f"{stage}_gpus_clause"] = "" if gpu is None else f"gpus: [ {gpu} ]"
        per_instance = self.sessions_per_duplex_instance
        values["duplex_max_sessions"] = str(per_instance)
        # More sequence slots than sessions: a START over the limit must reach our admission
        # check (and be refused at once, its slot freed) instead of waiting in Triton's silent
        # backlog. Triton hands new sequences to the lowest free slot number across instances,
        # so the instances fill evenly.
        values["sequence_slots"] = str(per_instance + REFUSAL_SLOTS)
        # Triton's own idle reaper must fire after ours, which answers the client.
        values["sequence_idle_us"] = str((self.idle_timeout_s + 30) * 1_000_000)
        return values

    def with_overrides(self, overrides: dict[str, str]) -> "Profile":
        fields = {f.name: f for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - set(fields))
        if unknown:
            raise ValueError(f"unknown configuration variables {unknown}; known: {sorted(fields)}")
        typed = {}
        for key, text in overrides.items():
            try:
                typed[key] = type(getattr(self, key))(text)
            except ValueError as exc:
                raise ValueError(f"{key}={text!r}: {exc}") from exc
        return dataclasses.replace(self, **typed)


PROFILES: dict[str, Profile] = {
    "cpu": Profile(name="cpu"),
    # One GPU: every stage on GPU 0, the allocator caps keep the Thinker's KV from starving
    # the Talker and the vocoder (Qwen3-8B bf16 ~17 GB + 34 slots x 8k tokens x 144 KiB KV
    # ~40 GB + the encoder's caches; Code2Wav's batched windows peaked at 26 GB for 16 streams
    # with the bf16 flow). A Thinker share of 0.45 (62.9 GiB of an H200) ran out in its warm-up
    # of 32 sessions (62.35 GiB allocated, perf/results/duplex_h200.md), so 0.5, taken from
    # Code2Wav's margin.
    "gpu": Profile(
        name="gpu", instance_kind="KIND_GPU", device="cuda", dtype="bfloat16", checkpoint="full-random",
        thinker_gpus="0", talker_gpus="0", code2wav_gpus="0",
        thinker_memory_fraction=0.5, talker_memory_fraction=0.12, code2wav_memory_fraction=0.33,
        duplex_instances=2, max_sessions=32, max_context_tokens=8192,
        # Not yet measured on the GPU with session voices: a benchmark with them ran out of
        # Code2Wav memory at C >= 16 before the 8-window cap (so did one without them); each
        # distinct voice adds its prompt caches.
        session_voices="off",
    ),
    # Two GPUs: the Thinker alone on GPU 0, the audio tail (Talker + Code2Wav) on GPU 1.
    "gpu-split": Profile(
        name="gpu-split", instance_kind="KIND_GPU", device="cuda", dtype="bfloat16", checkpoint="full-random",
        thinker_gpus="0", talker_gpus="1", code2wav_gpus="1",
        thinker_memory_fraction=0.9, talker_memory_fraction=0.45, code2wav_memory_fraction=0.45,
        duplex_instances=4, max_sessions=64, max_context_tokens=8192, session_voices="off",
    ),
    # One H200 (139.8 GiB as torch reports it), every share from the memory plan (deploy/README.md
    # "Memory plan"), as many sessions as it admits: a 4096-token Thinker window per session with
    # the sliding window on (`basic` drops the oldest turns past it), and a 1024-token Talker
    # context (a longer reply rolls over, backends/talker/rollover.py). 100 sessions with 64
    # Code2Wav cache slots (replies decoding at once), as measured on an H200 to C = 96
    # (perf/results/duplex_h200.md). The plan admits a slot per session (100) at this size; that
    # is not measured yet. 128 sessions fit this window only with fewer slots than sessions.
    "gpu-h200": Profile(
        name="gpu-h200", instance_kind="KIND_GPU", device="cuda", dtype="bfloat16", checkpoint="full-random",
        thinker_gpus="0", talker_gpus="0", code2wav_gpus="0", gpu_memory_gib=139.8,
        duplex_instances=4, max_sessions=100, code2wav_streams=64, max_context_tokens=4096,
        talker_context_tokens=1024, sliding_window_mode="basic", session_voices="off",
    ),
}


def get_profile(name: str) -> Profile:
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; choose one of {sorted(PROFILES)}")
    return PROFILES[name]
