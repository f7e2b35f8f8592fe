#!/usr/bin/env bash
# Runs lm-evaluation-harness (lm-eval 0.4.13 from PyPI, in its own venv: .cache/lmeval-venv) offline
# on the local tasks in tasks/ with its dummy model, and leaves what lm_eval wrote under OUT
# (default .cache/lmeval-out) for the importer's tests:
#   OUT/run/<model>/results_<date>.json and samples_<task>_<date>.jsonl   (--log_samples)
#   OUT/nosamples/<model>/results_<date>.json                             (no --log_samples)
# The dummy model answers every generation "lol" and every choice with a seeded random
# log-likelihood. Idempotent: OUT is made again each time; the venv once per pinned requirement.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv=${REPEATRATE_LMEVAL_VENV:-$root/.cache/lmeval-venv}
out=$(realpath -m "${1:-$root/.cache/lmeval-out}")
want="lm-eval==0.4.13"
if ! "$venv/bin/python" -c '' 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv"
fi
if [ "$(cat "$venv/.repeatrate-requirements" 2>/dev/null)" != "$want" ]; then
  "$venv/bin/python" -m pip install -q --disable-pip-version-check $want
  echo "$want" > "$venv/.repeatrate-requirements"
fi
# The lm_eval script (docs/feeding.md's example runs it) names the venv's path in its first line:
# a venv moved or copied elsewhere gets it written again.
if ! "$venv/bin/lm_eval" -h >/dev/null 2>&1; then
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps $want
fi
rm -rf "$out"
cd "$root" # the tasks name their data from the repository root
export HF_HOME="$root/.cache/hf" HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
run() { "$venv/bin/python" -m lm_eval --model dummy --tasks tiny_qa,tiny_mc --include_path test/lmeval/tasks "$@" >"$out.log" 2>&1 || { cat "$out.log" >&2; exit 1; }; }
mkdir -p "$out"
run --log_samples --output_path "$out/run"
run --output_path "$out/nosamples"
rm -f "$out.log"
echo "lmeval: lm_eval wrote $(find "$out" -type f | wc -l) files under $out"
