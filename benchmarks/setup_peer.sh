#!/usr/bin/env bash
# A separate virtual environment for the peer benchmark (benchmarks/peer_verifiers.py): the `verifiers` package
# pins openai<3 while this project uses openai 3.x, so it never goes into the project's environment. The peer
# runs as a subprocess of the benchmark and talks HTTP to our OpenAI-compatible server.
#
# verifiers 0.2.1 is the newest release whose classic API is at the top level: `vf.ToolEnv(dataset=...,
# tools=[python functions], max_turns=...)` + `env.evaluate(client=AsyncOpenAI(...), ...)`. (0.3.x moves it to
# `verifiers.legacy`; 0.4.0 replaces it with harness/taskset environments.)
#
#     bash benchmarks/setup_peer.sh            # creates /tmp/venv-verifiers-0.2.1 (or $PEER_VENV)
#
# Needs only PyPI. `PYTHON` picks the interpreter (default: python3.11, else python3).
set -euo pipefail

VERIFIERS_VERSION=0.2.1
PEER_VENV="${PEER_VENV:-/tmp/venv-verifiers-${VERIFIERS_VERSION}}"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"

if [ ! -x "$PEER_VENV/bin/python" ]; then
    "$PYTHON" -m venv "$PEER_VENV"
fi
"$PEER_VENV/bin/python" -m pip install --quiet --upgrade pip
"$PEER_VENV/bin/python" -m pip install --quiet "verifiers==${VERIFIERS_VERSION}"
"$PEER_VENV/bin/python" -c "import verifiers as vf, openai; print('verifiers', vf.__version__, 'openai', openai.__version__, 'in', '$PEER_VENV')"
