#!/usr/bin/env bash
# Check that our models' tensors survive the Python-backend stub under numpy 2 (not in CI:
# CI's .venv pins numpy 1.26). backends/serving/triton_tensors.py says what numpy 2 breaks in
# the 2.51 stub and how we avoid it; scripts/numpy2_stub_probe.py says what is checked.
#
#   bash scripts/check_numpy2_stub.sh            # probe: stage text fields + EVENT JSON (~1 min)
#   bash scripts/check_numpy2_stub.sh --e2e      # and a duplex conversation on the cpu profile
#   CHECK_PYTHON=/path/venv/bin/python bash scripts/check_numpy2_stub.sh
#       # check an existing environment as it is (e.g. the GPU machine's numpy-2 venv)
#
# Without CHECK_PYTHON it builds /tmp/minicpmo-numpy2/venv: .venv's interpreter, NUMPY_SPEC
# (default "numpy>=2,<3") from PyPI, everything else (torch, the server, this project) from
# .venv through a site dir behind it. The stub embeds that interpreter and imports that numpy
# (it runs Python isolated: PYTHONPATH is ignored there, only the venv on PATH counts).
# Exit 0 = every check passed. Before the fix the probe failed with "expected 1 string
# elements for inference input ... got 0" and an empty EVENT.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
scratch=${CHECK_SCRATCH:-/tmp/minicpmo-numpy2}
if [ -n "${CHECK_PYTHON:-}" ]; then
  py=$CHECK_PYTHON
  expect=()
else
  venv=$scratch/venv
  base=$(.venv/bin/python -c 'import sys; print(sys._base_executable)')
  site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  if [ ! -x "$venv/bin/python" ]; then
    "$base" -m venv "$venv"
  fi
  "$venv/bin/pip" install --quiet --disable-pip-version-check "${NUMPY_SPEC:-numpy>=2,<3}"
  venv_site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # After the venv's own site-packages: its numpy wins, the rest comes from .venv.
  echo "import site; site.addsitedir('$site')" > "$venv_site/zz_project_venv.pth"
  py=$venv/bin/python
  expect=(--expect-numpy 2)
fi
"$py" -c 'import numpy, torch; print(f"checking {numpy.__version__=} {torch.__version__=}")'
work=$scratch/work  # kept between runs: the tiny checkpoint is generated once
mkdir -p "$work"
exec "$py" "$root/scripts/numpy2_stub_probe.py" "${expect[@]}" --workdir "$work" "$@"
