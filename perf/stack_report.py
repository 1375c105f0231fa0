"""Top frames per thread from the stack samples a server wrote (backends/serving/stack_sampler.py).

    python3 perf/stack_report.py DIR [--thread engine] [--top 15]

For each `<stage>-<pid>.folded` file and each thread: its sample count, the frames with the
largest inclusive share (the thread was inside that function) and the largest self share (the
function was the leaf: where the time went, a GPU wait included). A sample is ~5 ms of wall
time of that thread, busy or not: an idle engine thread shows as its queue wait.
"""
from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from pathlib import Path


def read_folded(path: Path) -> dict[str, Counter[tuple[str, ...]]]:
    """{thread name: Counter(stack frames tuple -> samples)} of one file."""
    threads: dict[str, Counter[tuple[str, ...]]] = defaultdict(Counter)
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        thread, *frames = stack.split(";")
        threads[thread][tuple(frames)] += int(count)
    return threads


def shares(stacks: Counter[tuple[str, ...]]) -> tuple[int, Counter[str], Counter[str]]:
    """(total samples, inclusive samples per frame, self samples per frame)."""
    total, inclusive, own = 0, Counter(), Counter()
    for frames, count in stacks.items():
        total += count
        for frame in set(frames):
            inclusive[frame] += count
        if frames:
            own[frames[-1]] += count
    return total, inclusive, own


def report(path: Path, thread_filter: str, top: int) -> list[str]:
    lines = [f"## {path.name}"]
    for thread, stacks in sorted(read_folded(path).items()):
        if thread_filter not in thread:
            continue
        total, inclusive, own = shares(stacks)
        lines.append(f"### thread {thread}: {total} samples")
        lines += [f"  incl {100 * n / total:5.1f}%  {frame}" for frame, n in inclusive.most_common(top)]
        lines += [f"  self {100 * n / total:5.1f}%  {frame}" for frame, n in own.most_common(top)]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--thread", default="", help="only threads whose name contains this")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    for path in sorted(args.directory.glob("*.folded")):
        print("\n".join(report(path, args.thread, args.top)))


if __name__ == "__main__":
    main()
