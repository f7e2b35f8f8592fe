#!/usr/bin/env bash
# Makes the Python venv the oracle and importer tests use (.cache/venv, git-ignored), once:
# OpenCompass from PyPI without its dependencies (only its repeat-analysis module is run, with the
# imports it does not need stubbed: test/opencompass/oracle.py), numpy and tabulate, which that
# module imports, SciPy, which OpenCompass's G-Pass@k functions use (test/opencompass/passk.py),
# tiktoken (test/tiktoken/count.py; its encoding files are handed to it locally), and Inspect AI
# (test/inspect/make_logs.py), and the OpenTelemetry SDK with its OTLP/HTTP exporter
# (test/otlp/export_logs.py). A stamp file holds the pinned
# requirements; when they match, nothing is installed again.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${REPEATRATE_TEST_VENV:-.cache/venv}
deps="numpy==2.4.6 tabulate==0.10.0 scipy==1.17.1 tiktoken==0.14.0 inspect-ai==0.3.285 opentelemetry-sdk==1.45.2 opentelemetry-exporter-otlp-proto-http==1.45.2"
nodeps="opencompass==0.5.4"
stamp="$venv/.repeatrate-requirements"
want="$deps --no-deps $nodeps"
# A venv whose interpreter no longer runs (another Python in a cached image) is made again.
if ! "$venv/bin/python" -c '' 2>/dev/null; then
  rm -rf "$venv"
fi
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
# pip runs as a module of the venv's python: its own script names the venv's path in its first
# line, and a venv moved or copied elsewhere would not run it.
"$venv/bin/python" -c '' 2>/dev/null || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check $deps
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps $nodeps
echo "$want" > "$stamp"
echo "pyenv: $venv ready ($want)"
