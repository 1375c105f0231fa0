"""The repository speaks of the product, not of how it was built.

Every tracked text file (perf/results/ aside: measurement pages keep their dates and commits)
is scanned for words that only make sense to whoever built it: numbered work periods, run or
issue numbers, "lent" machines, AI tool names, notes kept outside the repository, and results
pages that no longer exist. "Session" is a product word here (a duplex session), so the patterns
only catch the numbered forms a product text never uses. Each pattern is also run against
sample sentences, so a pattern that stopped matching fails here instead of passing silently.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "perf" / "results"
SKIPPED_PREFIXES = ("perf/results/",)
THIS_FILE = "tests/test_project_text.py"
_I = re.IGNORECASE

# Ordinals from the ninth up, spelled or numeric: product text speaks of a session's first few.
_ORDINAL = (r"(?:ninth|tenth|eleventh|twelfth|(?:thir|four|fif|six|seven|eigh|nine)teenth|"
            r"(?:twent|thirt|fort|fift)ieth|(?:twenty|thirty|forty|fifty)-?"
            r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth)|\d+(?:st|nd|rd|th))")
# Units after "run(s) N" that make it a count ("runs 16 programs"), not a run's number.
_COUNTED = r"(?:ms|s|us|x|%|times|steps|programs|kernels|tokens|frames|units|rows|turns|levels)\b"

PATTERNS: dict[str, re.Pattern[str]] = {
    "numbered work period": re.compile(
        rf"\b{_ORDINAL}\s+(?:work\s+)?(?:session|period)s?\b"
        r"|(?<![-_\w])(?<!\d )sessions?\s+\d{2,}(?!\s*" + _COUNTED + r")(?:\s*[-–]\s*\d+)?\b",
        _I),
    "run number": re.compile(
        r"\bruns?\s+\d+(?:\s*[-–]\s*\d+)?\b(?!\s*" + _COUNTED + r")|\brun_?\d+\b", _I),
    "issue number": re.compile(r"\bissues?[\s#-]*\d+\b", _I),
    "stop number": re.compile(r"\bstop\s+\d+\b", _I),
    "lent machine": re.compile(r"\b(?:lent|lending)\b", _I),
    "AI tool": re.compile(
        r"\b(?:claude|anthropic|chatgpt|gpt-?[345]o?|copilot|subagents?|sub-agents?)\b", _I),
    # How GPU time was handed out while building, not how to run on a GPU machine.
    "GPU lending tool": re.compile(
        r"\bdevice tool\b|`run` tool|\bdevice calls?\b|\b\d+-minute call\b|\bnvidia-h[12]00\b", _I),
    "work-period tag": re.compile(r"(?:\b|_)s\d{2}_|_s\d{2}\b"),
    "note outside the repository": re.compile(
        r"ARCHITECTURE\.md|shared/design|\b[a-z0-9]+_notes\b|\b(?!model_)[a-z0-9]+_facts\b"
        r"|\bfacts\s+(?:\d+\.\d+|section|edge)|duplex_anchors|mrv2_blueprint|style_by_example"
        r"|internal_contracts"),
}
# A results page's name (duplex_h200.md, runner_h200.json, placements_h200x2.png, ...).
RESULTS_PAGE = re.compile(r"\b[a-z0-9_]+_(?:h[12]00(?:x\d)?|cpu)\.(?:md|json|png)\b")

SHOULD_MATCH = {
    "numbered work period": ["added in the thirty-second session", "measured in the 16th session",
                             "sixteenth\nsession", "on an H100 in sessions 30-32"],
    "run number": ["duplex_h200.md runs 9-10", "(perf/results/duplex_h200.md, run 3)", "run11"],
    "issue number": ["targets (issue 5)", "issue 9's placements", "see the issue-7 note",
                     "issue #12"],
    "stop number": ["as of stop 12"],
    "lent machine": ["on the lent H200"],
    "AI tool": ["written with Claude", "a subagent", "gpt-4"],
    "GPU lending tool": ["through the device tool", "the `run` tool", "one device call per part",
                         "one 10-minute call", "kind nvidia-h200-x2"],
    "work-period tag": ["code2wav_s19_tiles.md", "s26_probe.py"],
    "note outside the repository": [
        "ARCHITECTURE.md section 4", "../shared/design/x.md", "triton_notes.md 0.9",
        "token2wav_facts.md 1.9", "facts 2.6", "facts edge case 1", "duplex_anchors.md",
        "docs/internal_contracts.md"],
}
SHOULD_NOT_MATCH = [
    "the first session may grow the pools", "the fifth session of each step", "--sessions 4",
    "max_sessions 32", "at 16 sessions 214 ms without", "kernel runs 16 programs", "runs 5 times",
    "session s10 stopped", "write s24.wav", "docs/model_facts.md#sizes", "READING_NOTES = (",
    "the stop action", "OpenAI-Realtime-style names", "a session's 2 epochs",
]


def _tracked_text_files() -> dict[str, str]:
    """Path -> text of every tracked file outside perf/results/ that decodes as UTF-8 text."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    texts = {}
    for name in names:
        path = ROOT / name
        if not name or name == THIS_FILE or name.startswith(SKIPPED_PREFIXES) or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary
        try:
            texts[name] = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
    return texts


def _where(name: str, text: str, start: int) -> str:
    return f"{name}:{text.count(chr(10), 0, start) + 1}"


@pytest.fixture(scope="module")
def texts() -> dict[str, str]:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    found = _tracked_text_files()
    assert len(found) > 100, "git ls-files listed almost nothing"
    return found


@pytest.mark.parametrize("label", sorted(PATTERNS))
def test_patterns_catch_what_they_are_for(label: str) -> None:
    for sample in SHOULD_MATCH[label]:
        assert PATTERNS[label].search(sample), (label, sample)


@pytest.mark.parametrize("sample", SHOULD_NOT_MATCH)
def test_patterns_leave_product_text_alone(sample: str) -> None:
    assert not [label for label, pattern in PATTERNS.items() if pattern.search(sample)], sample


def test_results_page_names_are_recognised() -> None:
    assert RESULTS_PAGE.findall("see perf/results/stages_h200.md and placements_h200x2.json") == [
        "stages_h200.md", "placements_h200x2.json"]


def test_no_build_history_in_tracked_files(texts: dict[str, str]) -> None:
    hits = [f"{_where(name, text, m.start())}: {label}: {m.group(0)!r}"
            for name, text in texts.items() for label, pattern in PATTERNS.items()
            for m in pattern.finditer(text)]
    assert not hits, "\n".join(hits)


def test_cited_results_pages_exist(texts: dict[str, str]) -> None:
    pages = {path.name for path in RESULTS.iterdir()}
    missing = [f"{_where(name, text, m.start())}: {m.group(0)}" for name, text in texts.items()
               for m in RESULTS_PAGE.finditer(text) if m.group(0) not in pages]
    assert not missing, "\n".join(missing)
