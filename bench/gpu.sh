#!/usr/bin/env bash
# The GPU path in one script, at most 10 minutes on one CUDA GPU; prints JSON lines.
#
#   bash bench/gpu.sh            # on a CUDA machine: builds .venv-gpu from requirements-gpu.txt first
#   bash bench/gpu.sh --cpu      # without a GPU: the same steps on this repo's CPU venv (.venv, make venv)
#
# 1. The GPU venv: requirements-gpu.txt (vLLM's CUDA wheel and its torch), through scripts/venv_install.py.
# 2. bench/rl_step.py --device cuda: a vLLM engine on the GPU (tokens/s, against HF generate), a GRPO update
#    on the GPU, the weight sync through vLLM's CUDA IPC transfer beside a device memcpy of the same bytes,
#    and the GPU's memory bandwidth (sync_GBps beside device_copy_GBps).
# 3. Two GRPO steps of the real job (`python -m tasks train`: Ray Train on the GPU, vLLM rollout actors on
#    it, NCCL weight transfer), seconds per step from its metrics.jsonl.
# Until it has run on a GPU, README says so; tests/unit/bench/test_gpu_script.py checks its syntax and
# runs its CPU fallback's plan (--dry-run).
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=gpu
DRY=0
for arg in "$@"; do
  case "$arg" in
    --cpu) MODE=cpu ;;
    --dry-run) DRY=1 ;;
    *) echo "usage: bash bench/gpu.sh [--cpu] [--dry-run]" >&2; exit 2 ;;
  esac
done
if [[ $MODE == gpu ]] && ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "bench/gpu.sh: no nvidia-smi on this machine; run with --cpu for the CPU fallback" >&2
  exit 1
fi

run() {
  echo "+ $*" >&2
  if [[ $DRY == 0 ]]; then "$@"; fi
}

OUT=${GPU_BENCH_OUT:-runs/gpu-bench}
if [[ $MODE == gpu ]]; then
  VENV=.venv-gpu
  DEVICE=cuda
  # the engine and the trainer share the GPU: IPC; the Ray job's actors and trainer: NCCL
  TRAIN_SETS=(--set grpo.gpus_per_train_worker=0.5 --set rollout.gpus_per_worker=0.25
    --set rollout.num_workers=2 --set rollout.weight_transfer_backend=nccl)
  run nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  if [[ ! -x $VENV/bin/python ]]; then run python3 -m venv "$VENV"; fi
  run "$VENV/bin/python" scripts/venv_install.py -r requirements-gpu.txt -r requirements-test.txt
else
  VENV=.venv
  DEVICE=cpu
  TRAIN_SETS=()
  run make venv
fi
PY=$VENV/bin/python

run "$PY" bench/rl_step.py --quick --device "$DEVICE"
# a small champion for the job to start from, then two GRPO steps of the real job
run timeout 300 "$PY" -m tasks --set bootstrap.steps=100 bootstrap --out "$OUT/champion"
run timeout 300 "$PY" -m tasks --set grpo.steps=2 --set grpo.validation_tasks=0 "${TRAIN_SETS[@]}" \
  train --init "$OUT/champion" --run-dir "$OUT/train"
if [[ $DRY == 0 ]]; then
  "$PY" - "$OUT/train/metrics.jsonl" "$DEVICE" <<'EOF'
import json, sys
steps = [json.loads(line) for line in open(sys.argv[1])]
print(json.dumps({
    "bench": "gpu_train", "device": sys.argv[2], "steps": len(steps),
    "step_s": [round(m["rollout_s"] + m["train_s"] + m.get("ahead_wait_s", 0) + m["weight_sync_s"], 3) for m in steps],
    "sync_GBps": [round(m["weight_sync_bytes"] / max(m["weight_sync_s"], 1e-9) / 1e9, 3) for m in steps],
    "generated_tokens_per_s": [round(m["generated_tokens"] / max(m["rollout_s"], 1e-9), 1) for m in steps],
}))
EOF
fi
