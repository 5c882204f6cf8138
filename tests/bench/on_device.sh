#!/usr/bin/env bash
# Runs a command on a lent GPU machine whose Python has torch but not kembed's other dependencies:
# installs the wheels carried in .whl/ (built here with `pip download`, see docs/benchmarks.md) into
# /tmp/site, makes this tree importable as `kembed` (the package-dir mapping of pyproject.toml, as
# links), then runs the command. `bash tests/bench/on_device.sh python3 -P tests/bench/bench_online.py`.
set -euo pipefail
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
mkdir -p /tmp/shim/kembed
for pair in gateway:gateway worker:worker proto:proto operator:operator/kembed_operator monitoring:monitoring; do
  ln -sfn "$PWD/${pair#*:}" "/tmp/shim/kembed/${pair%%:*}"
done
export PYTHONPATH="/tmp/shim:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
exec "$@"
