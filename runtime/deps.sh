#!/bin/sh
# deps.sh DIR: install the dependencies whose lockfiles DIR holds (the deps
# layer's declared inputs).  Edit it for your project: it is an input of the
# deps layer, so a change rebuilds that layer.  lw-sandbox may run it again
# inside a sandbox whose lockfiles differ from the image's.
set -eu
cd "$1"
did=
if [ -f package-lock.json ] && command -v npm >/dev/null; then
    npm ci --ignore-scripts --no-audit --no-fund
    did=1
fi
if [ -f requirements.txt ] && command -v python3 >/dev/null; then
    python3 -m venv /opt/loopwright/venv
    /opt/loopwright/venv/bin/pip install --no-cache-dir -r requirements.txt
    did=1
fi
if [ -f Cargo.lock ] && command -v cargo >/dev/null; then
    cargo fetch --locked
    did=1
fi
[ -n "$did" ] || echo "deps.sh: no dependency installed (no lockfile with a matching tool)"
