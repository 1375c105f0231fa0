"""What the duplex benchmark sends: groups of turns built from bundled prompts and voices.

Mirrors the Seed-TTS duplex benchmark (docs/metrics.md#the-duplex-realtime-benchmark): one
benchmark request is a group of `turns_per_group` consecutive prompt rows after a seeded shuffle;
the group's voice (its first row's prompt wav) is the reference for every turn of the group. Each
turn is sent as `initial_user_text` of its own session, with REF_AUDIO = the group's voice.

Reply shape: random weights make the listen/speak policy meaningless, so every turn forces
a reply of `reply_units` speak units (drawn per turn in [min_units, max_units]) of
`tokens_per_unit` text tokens each. Defaults follow the real model's typical shape: about 4
text tokens per 1-second speaking unit, replies of 4 to 6 units.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

DATA_DIR = Path(__file__).resolve().parent / "data"
PROMPTS_FILE = DATA_DIR / "prompts.txt"
VOICES_DIR = DATA_DIR / "voices"
UPLINK_SAMPLE_RATE = 16000
MAX_TOKENS_PER_UNIT = 17  # the policy's 20-token unit cap minus its 3 control slots


@dataclass(frozen=True, slots=True)
class ReplyShape:
    min_units: int = 4
    max_units: int = 6
    tokens_per_unit: int = 4

    def __post_init__(self) -> None:
        if not 1 <= self.min_units <= self.max_units <= 64:
            raise ValueError(f"need 1 <= min_units <= max_units <= 64, got {self.min_units}..{self.max_units}")
        if not 1 <= self.tokens_per_unit <= MAX_TOKENS_PER_UNIT:
            raise ValueError(f"tokens_per_unit must be in [1, {MAX_TOKENS_PER_UNIT}], got {self.tokens_per_unit}")

    def describe(self) -> str:
        return f"{self.min_units}-{self.max_units} units x {self.tokens_per_unit} text tokens"


@dataclass(frozen=True, slots=True)
class TurnSpec:
    """One turn: its own session, opened with `text` as the user's first words."""

    group: int
    turn: int
    text: str
    voice: str  # key into Workload.voices
    reply_units: int
    tokens_per_unit: int
    seed: int


@dataclass(frozen=True, slots=True)
class Workload:
    prompts: tuple[str, ...]
    voices: dict[str, np.ndarray]  # name -> [n] int16 16 kHz mono
    shape: ReplyShape

    @staticmethod
    def load(shape: ReplyShape, prompts_file: Path = PROMPTS_FILE, voices_dir: Path = VOICES_DIR) -> "Workload":
        return Workload(load_prompts(prompts_file), load_voices(voices_dir), shape)

    def groups(self, num_groups: int, turns_per_group: int, seed: int) -> list[list[TurnSpec]]:
        """`num_groups` groups of `turns_per_group` turns; a pure function of `seed`."""
        if num_groups < 1 or turns_per_group < 1:
            raise ValueError(f"need num_groups >= 1 and turns_per_group >= 1, got {num_groups}, {turns_per_group}")
        rng = np.random.default_rng(seed)
        order = rng.permutation(len(self.prompts))
        names = sorted(self.voices)
        groups = []
        for g in range(num_groups):
            first_row = int(order[(g * turns_per_group) % len(order)])
            voice = names[first_row % len(names)]  # the first row's voice serves the group
            groups.append([self._turn(g, t, order, voice, rng, seed, turns_per_group) for t in range(turns_per_group)])
        return groups

    def _turn(self, group: int, turn: int, order: np.ndarray, voice: str, rng: np.random.Generator,
              seed: int, turns_per_group: int) -> TurnSpec:
        row = int(order[(group * turns_per_group + turn) % len(order)])
        units = int(rng.integers(self.shape.min_units, self.shape.max_units + 1))
        return TurnSpec(group, turn, self.prompts[row], voice, units, self.shape.tokens_per_unit,
                        seed + 1000 * group + turn)


def load_prompts(path: Path = PROMPTS_FILE) -> tuple[str, ...]:
    """Non-empty lines of `path` that are not `#` comments."""
    lines = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
    prompts = tuple(line for line in lines if line and not line.startswith("#"))
    if not prompts:
        raise ValueError(f"{path} holds no prompt sentences")
    return prompts


def load_voices(directory: Path = VOICES_DIR) -> dict[str, np.ndarray]:
    """Every `*.wav` of `directory` as [n] int16 16 kHz mono, keyed by file stem."""
    from client.wav import read_wav

    voices = {}
    for path in sorted(Path(directory).glob("*.wav")):
        wav = read_wav(path)
        if wav.sample_rate != UPLINK_SAMPLE_RATE or wav.num_channels != 1:
            raise ValueError(f"{path}: reference voices must be 16 kHz mono, got {wav.sample_rate} Hz "
                             f"x {wav.num_channels} channels")
        voices[path.stem] = wav.samples[:, 0].copy()
    if not voices:
        raise ValueError(f"no reference voices (*.wav) in {directory}; run `python -m perf.voices`")
    return voices
