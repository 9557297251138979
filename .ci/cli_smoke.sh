#!/usr/bin/env bash
# Every command of an installed rlplan, run as a user runs it, from the folder of a venv that holds a built wheel
# or sdist (never the editable checkout): `bash .ci/cli_smoke.sh VENV [planner|charts|runtime]`.
# planner: the planner commands and what the runtime commands say without the runtime extra;
# charts: also the charts extra's commands; runtime: also `rlplan demo` and `rlplan run` of a CPU plan.
# Each line names the exit code the README promises; a mismatch prints the command's output and fails.
set -uo pipefail
venv="$1"; level="${2:-planner}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
rlplan="$venv/bin/rlplan"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
cd "$work"
failures=0

expect() {  # expect CODE COMMAND...: run it, compare the exit code
  local want="$1"; shift
  local got=0
  "$@" >"$work/out" 2>&1 || got=$?
  if [[ " $want " == *" $got "* ]]; then
    echo "ok   (exit $got) $*"
  else
    echo "FAIL (exit $got, want $want) $*"; sed 's/^/     | /' "$work/out" | tail -n 30
    failures=$((failures + 1))
  fi
}

expect_json() {  # expect_json CODE COMMAND...: as expect, and stdout is one JSON object
  local want="$1"; shift
  local got=0
  "$@" >"$work/out.json" 2>"$work/err" || got=$?
  if [[ " $want " == *" $got "* ]] && "$venv/bin/python" -c 'import json,sys; json.load(open(sys.argv[1]))' "$work/out.json"; then
    echo "ok   (exit $got, JSON) $*"
  else
    echo "FAIL (exit $got, want $want and one JSON object) $*"; tail -n 20 "$work/out.json" "$work/err" | sed 's/^/     | /'
    failures=$((failures + 1))
  fi
}

# Nothing may come from the checkout: the installed package is the venv's own.
expect 0 "$venv/bin/python" -c "import rlplan.planner as p, sys; sys.exit(0 if '$venv' in p.__file__ else 1)"
expect 0 "$rlplan" --version
expect 0 "$rlplan" --help
expect 0 "$rlplan" presets models
expect 0 "$rlplan" presets gpus
expect 0 "$rlplan" schema
expect 0 "$rlplan" solve --model qwen2.5-7b --gpus 8 --gpu h100-80g --prompt-len 1024 --response-len 2048 -o plan.toml
expect_json 0 "$rlplan" solve --model qwen2.5-0.5b --gpus 1 --gpu h100-80g --prompt-len 512 --response-len 1024 --json -o small.toml
expect 1 "$rlplan" solve --model qwen2.5-72b --gpus 1 --gpu rtx4090 --prompt-len 512 --response-len 512
expect 0 "$rlplan" validate plan.toml
expect_json 0 "$rlplan" explain plan.toml --json
expect 0 "$rlplan" explain plan.toml
expect 0 "$rlplan" render plan.toml --target verl -o run.sh
expect 0 "$rlplan" render plan.toml --target verl --format overrides -o overrides.txt
expect 0 "$rlplan" render plan.toml --target slurm -o job.slurm
expect 0 "$rlplan" import verl run.sh --gpu h100-80g -o imported.toml
expect 0 "$rlplan" validate imported.toml
expect "0 1" "$rlplan" import verl "$repo/tests/data/verl_logs/public/qwen2_7b_gsm8k_8gpu_min.sh" --gpu h100-80g -o public.toml
expect "0 1" "$rlplan" compare "$repo/tests/data/verl_logs/public/qwen2_7b_gsm8k_8gpu_min.sh" \
  "$repo/tests/data/verl_logs/public/verl_qwen2_7b_min.log" --gpu h100-80g
expect 0 "$rlplan" calibrate --from-verl-log "$repo/tests/data/verl_logs/public/verl_qwen2_7b_min.log" \
  --plan "$repo/tests/data/verl_logs/public/qwen2_7b_gsm8k_8gpu_min.sh" --gpu h100-80g -o profile.toml
expect "0 1" "$rlplan" validate plan.toml --profile profile.toml
expect_json 2 "$rlplan" validate missing.toml --json
expect_json 2 "$rlplan" solve --gpus 2.5 --json
expect_json 2 "$rlplan" validate --json
expect 2 "$rlplan" solve --model no-such-model --gpus 8 --gpu h100-80g

case "$level" in
  planner)
    # Without the runtime extra, a runtime command names the install instead of a traceback.
    expect 2 "$rlplan" run plan.toml
    expect 2 "$rlplan" measure plan.toml ;;
  charts|runtime)
    expect 0 "$rlplan" explain plan.toml --chart plan.html
    expect 0 "$rlplan" solve --model qwen2.5-7b --gpus 8 --gpu h100-80g --prompt-len 1024 --response-len 2048 --frontier frontier.html -o f.toml
    expect "0 1" "$rlplan" compare "$repo/tests/data/verl_logs/public/qwen2_7b_gsm8k_8gpu_min.sh" \
      "$repo/tests/data/verl_logs/public/verl_qwen2_7b_min.log" --gpu h100-80g --chart compare.png ;;
esac

if [[ "$level" == runtime ]]; then
  export RAY_AUTH_MODE=disabled VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1
  expect 0 "$rlplan" demo --steps 2 --output-dir demo
  expect 0 "$rlplan" report demo/run -o report.html
  expect 0 "$rlplan" measure demo/plan.toml
fi

echo "cli smoke ($level): $failures failure(s)"
exit $((failures > 0))
