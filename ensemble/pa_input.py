"""Write perf_analyzer input data for the `audio_tail` ensemble (ensemble/README.md).

    python ensemble/pa_input.py --out /tmp/audio_tail.json [--ids 64] [--tokens 10] [--llm-dim 64]

Each entry is one utterance: a distinct request id, condition 0, `--tokens` handed token ids
with their hidden rows (`--llm-dim` wide: 64 for the tiny checkpoint, 4096 for the real and
full-random ones), mid-turn flags (exactly 25 codec frames -> 2 audio chunks). perf_analyzer
takes the entries round-robin; with more ids than the concurrency, an id is never in flight twice.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def entries(num_ids: int, num_tokens: int, llm_dim: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{
        "REQUEST_ID": {"content": list(f"pa-{index}".encode()), "shape": [len(f"pa-{index}")]},  # UTF-8 bytes
        "CONDITION_SEQ": [0],
        "TOKEN_IDS": {"content": rng.integers(10, 40, num_tokens).tolist(), "shape": [num_tokens]},
        "HIDDEN": {"content": rng.standard_normal(num_tokens * llm_dim).round(4).tolist(),
                   "shape": [num_tokens, llm_dim]},
        "TURN_START": [False],
        "TURN_END": [False],
    } for index in range(num_ids)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ids", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=10)
    parser.add_argument("--llm-dim", type=int, default=64)
    args = parser.parse_args()
    if min(args.ids, args.tokens, args.llm_dim) < 1:
        raise ValueError("--ids, --tokens and --llm-dim must be positive")
    args.out.write_text(json.dumps({"data": entries(args.ids, args.tokens, args.llm_dim)}))
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
