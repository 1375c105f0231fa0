#!/usr/bin/env bash
# Regenerates hello_16k.wav, the demo input of `minicpmo-client` (16 kHz mono PCM16, ~2.6 s).
# Needs espeak-ng and sox (Debian: apt-get install -y espeak-ng sox). The committed wav is
# what ships; rerun this only to change the sentence. Output differs slightly across
# espeak-ng versions (made with espeak-ng 1.51 on Debian 12).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
text="Hello! Please tell me a short story."
tmp="$(mktemp --suffix=.wav)"
trap 'rm -f "$tmp"' EXIT

# en-us voice at 170 words per minute; espeak-ng writes 22.05 kHz mono.
espeak-ng -v en-us -s 170 -w "$tmp" "$text"
# Resample to 16 kHz, 16-bit signed, mono; normalise to -3 dBFS; trim edge silence to 100 ms.
sox "$tmp" -r 16000 -b 16 -e signed-integer -c 1 "$here/hello_16k.wav" \
    norm -3 silence 1 0.05 0.1% reverse silence 1 0.05 0.1% reverse pad 0.1 0.1
soxi "$here/hello_16k.wav"
