#!/usr/bin/env bash
# Create benchmarks/.venv-recbole: RecBole 1.2.1 next to the same CPU torch that seqrec uses.
# Idempotent: an existing venv that already imports the pinned versions is left alone.
# torch goes in first and is pinned by a constraints file for every later step, so no
# dependency can swap it for another build (a CUDA torch would be gigabytes).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${RECBOLE_VENV:-$here/.venv-recbole}"
python="${PYTHON:-python3.11}"
torch_version="2.13.0"

pins=(
  "recbole==1.2.1"
  "numpy==1.26.4"        # RecBole uses np.float / np.long; numpy 2 also breaks pandas<2.2 ABIs
  "scipy==1.13.1"
  "pandas==2.2.3"
  "scikit-learn==1.5.2"
  "colorlog==4.7.2"      # RecBole pins these two exactly
  "colorama==0.4.4"
  "tensorboard==2.18.0"  # imported at module level (torch.utils.tensorboard)
  "ray==2.6.3"           # RecBole requires ray<=2.6.3 (imported by recbole.quick_start)
  "setuptools==80.10.2"  # ray 2.6 imports pkg_resources, gone from setuptools>=81
  "protobuf==4.25.9"     # ray 2.6 / tensorboard predate protobuf 5+
  "thop==0.1.1.post2209072238"
  "pyyaml" "tqdm" "tabulate" "plotly" "texttable" "psutil"
)

ok() {
  [[ -x "$venv/bin/python" ]] && "$venv/bin/python" - "$torch_version" <<'PY' 2>/dev/null
import sys
import numpy, recbole, torch
assert torch.__version__.split("+")[0] == sys.argv[1], torch.__version__
assert recbole.__version__ == "1.2.1", recbole.__version__
assert numpy.__version__ == "1.26.4", numpy.__version__
PY
}

if ok; then
  echo "recbole venv ready: $venv"
  exit 0
fi

[[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==$torch_version" > "$constraints"

"$venv/bin/python" -m pip install --upgrade "pip>=23"
"$venv/bin/python" -m pip install "torch==$torch_version"
"$venv/bin/python" -m pip install -c "$constraints" "${pins[@]}"

ok || { echo "recbole venv check failed: $venv" >&2; exit 1; }
echo "recbole venv ready: $venv"
