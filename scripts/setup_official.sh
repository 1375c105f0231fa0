#!/usr/bin/env bash
# Create .venv-official (once): the official MiniCPM-o 4.5 code's own stack (transformers 4.51 +
# accelerate, tests/official/requirements.txt) for the parity tests in tests/official/.
# torch comes from .venv through a .pth file that names a folder holding links to torch alone,
# so pip here never sees nor touches another package of .venv. Skipped without the official code.
set -euo pipefail
cd "$(dirname "$0")/.."
OFFICIAL=../shared/reference/minicpmo45-official
VENV=.venv-official
REQ=tests/official/requirements.txt
if [ ! -f "$OFFICIAL/modeling_minicpmo.py" ]; then
  echo "setup_official: no official code at $OFFICIAL; its parity tests will skip"
  exit 0
fi
main_site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
torch_dist=$(cd "$main_site" && ls -d torch-*.dist-info)
stamp=$VENV/.installed-$(cat "$REQ" scripts/setup_official.sh <(echo "$torch_dist") | sha1sum | cut -c1-12)
[ -f "$stamp" ] && exit 0
rm -rf "$VENV"
"${PYTHON:-python3}" -m venv "$VENV"
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$VENV/main-torch"
for name in torch torchgen functorch "$torch_dist"; do
  if [ -e "$main_site/$name" ]; then ln -s "$(realpath "$main_site/$name")" "$VENV/main-torch/"; fi
done
realpath "$VENV/main-torch" > "$site/main-torch.pth"
"$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps -r "$REQ"
"$VENV/bin/pip" check --disable-pip-version-check >/dev/null
"$VENV/bin/python" -c 'import torch, transformers, accelerate, PIL
assert transformers.__version__ == "4.51.0", transformers.__version__'
touch "$stamp"
