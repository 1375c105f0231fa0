"""Give the Python backend's hand-off to a stub a 10-second wait instead of one second.

Triton 2.51's Python backend hands a batch of requests to a model's stub process and then
waits for the stub's receipt in `StubLauncher::ReceiveMessageFromStub`: one second, after which
it gives up unless the stub's heartbeat thread has run in that second. Giving up fails the
requests and frees their shared memory while the stub still has them queued; when the stub
runs again it answers that abandoned batch, the next hand-off reads the stale answer, and the
whole server aborts (`boost::interprocess::lock_exception`, Signal 6 or 11). So any pause of a
stub process of about a second during a hand-off (a saturated or briefly frozen machine)
killed the server. The wait is a compiled-in constant; this rewrites the one-second timeouts
of that one function (the heartbeat lock, the receipt's semaphore and queue lock, the heartbeat
check: five immediates in two instruction forms) to STUB_WAIT_S. A stub that died is still
found: the wait then ends with the same error ten seconds later, and the readiness probe's
request to that model fails (backends/serving/health.py), which a supervised server answers
with a restart. A pause longer than STUB_WAIT_S still aborts the server, as before.

    python -m backends.serving.stub_wait_patch PATH/libtriton_python.so [--check]
"""
from __future__ import annotations

import argparse
import os
import struct
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

STUB_WAIT_S = 10
FUNCTION = "_ZN6triton7backend6python12StubLauncher22ReceiveMessageFromStubERl"
# boost's ptime counts microseconds from Julian day 0; the compiler folds "now + 1 s" minus the
# Unix epoch (JD 2440588) into one 64-bit constant where it builds a timespec.
_UNIX_EPOCH_US = 2_440_588 * 86_400 * 1_000_000


def _is_add_imm32(code: bytes, at: int) -> bool:  # 48 05 imm32 | 48/49 81 c0+r imm32
    return (at >= 2 and code[at - 2:at] == b"\x48\x05") or \
        (at >= 3 and code[at - 3] in (0x48, 0x49) and code[at - 2] == 0x81 and 0xC0 <= code[at - 1] <= 0xC7)


def _is_movabs(code: bytes, at: int) -> bool:  # 48/49 b8+r imm64
    return at >= 2 and code[at - 2] in (0x48, 0x49) and 0xB8 <= code[at - 1] <= 0xBF


@dataclass(frozen=True)
class TimeoutForm:
    """One way the compiler wrote a one-second timeout, and how many times the function has it."""

    original: bytes
    patched: bytes
    is_instruction: Callable[[bytes, int], bool]
    count: int


FORMS = (
    TimeoutForm(struct.pack("<I", 1_000_000), struct.pack("<I", STUB_WAIT_S * 1_000_000), _is_add_imm32, 4),
    TimeoutForm(struct.pack("<Q", (1_000_000 - _UNIX_EPOCH_US) % 2**64),
                struct.pack("<Q", (STUB_WAIT_S * 1_000_000 - _UNIX_EPOCH_US) % 2**64), _is_movabs, 1),
)


class StubWaitPatchError(RuntimeError):
    """The library is not a Python backend whose hand-off wait this module knows how to change."""


@dataclass(frozen=True)
class CodeRange:
    offset: int  # in the file
    size: int


def function_range(image: bytes, name: str = FUNCTION) -> CodeRange:
    """Where a function's code lies in an ELF64 little-endian shared object (from .symtab)."""
    if image[:4] != b"\x7fELF" or image[4] != 2 or image[5] != 1:
        raise StubWaitPatchError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", image, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", image, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", image, shoff + i * shentsize) for i in range(shnum)]
    wanted = name.encode()
    for _, sh_type, _, _, offset, size, link, _, _, entsize in sections:
        if sh_type != 2 or entsize != 24:  # SHT_SYMTAB
            continue
        strings = sections[link][4]
        for at in range(offset, offset + size, entsize):
            st_name, _, _, shndx, value, sym_size = struct.unpack_from("<IBBHQQ", image, at)
            end = image.index(b"\0", strings + st_name)
            if image[strings + st_name:end] == wanted and 0 < shndx < shnum:
                section = sections[shndx]
                return CodeRange(section[4] + value - section[3], sym_size)
    raise StubWaitPatchError(f"no symbol {name} (a stripped or different Python backend build)")


def _find(code: bytes, immediate: bytes, is_instruction: Callable[[bytes, int], bool]) -> list[int]:
    found, at = [], code.find(immediate)
    while at != -1:
        if is_instruction(code, at):
            found.append(at)
        at = code.find(immediate, at + 1)
    return found


def _function_code(image: bytes) -> tuple[CodeRange, bytes]:
    code_range = function_range(image)
    return code_range, image[code_range.offset:code_range.offset + code_range.size]


def state(path: Path) -> str:
    """'patched', 'original' or why neither (an unknown build)."""
    return _state(path.read_bytes())


def _state(image: bytes) -> str:
    try:
        _, code = _function_code(image)
    except StubWaitPatchError as err:
        return f"unknown: {err}"
    original = [len(_find(code, form.original, form.is_instruction)) for form in FORMS]
    patched = [len(_find(code, form.patched, form.is_instruction)) for form in FORMS]
    expected = [form.count for form in FORMS]
    if original == expected and not any(patched):
        return "original"
    if patched == expected and not any(original):
        return "patched"
    return f"unknown: one-second timeouts {original}, {STUB_WAIT_S}-second {patched}, expected {expected}"


def patch(path: Path) -> bool:
    """Patch `path` in place (atomically: processes that mapped the old file keep it).
    True if it changed, False if it was patched already."""
    original = path.read_bytes()
    current = _state(original)
    if current == "patched":
        return False
    if current != "original":
        raise StubWaitPatchError(f"{path}: {current}")
    image = bytearray(original)
    code_range, code = _function_code(original)
    for form in FORMS:
        for at in _find(code, form.original, form.is_instruction):
            start = code_range.offset + at
            image[start:start + len(form.patched)] = form.patched
    handle, staging = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(image)
        os.chmod(staging, path.stat().st_mode)
        os.replace(staging, path)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("library", type=Path, help="the Python backend's libtriton_python.so")
    parser.add_argument("--check", action="store_true", help="only report: exit 0 when patched")
    args = parser.parse_args(argv)
    if args.check:
        current = state(args.library)
        print(f"{args.library}: {current}")
        return 0 if current == "patched" else 1
    try:
        changed = patch(args.library)
    except StubWaitPatchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{args.library}: {'patched' if changed else 'already patched'} ({STUB_WAIT_S} s hand-off wait)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
