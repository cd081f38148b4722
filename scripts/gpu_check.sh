#!/usr/bin/env bash
# One-GPU check of the real backend (docs/real-backend.md), meant to finish in < 8 minutes:
#   1. the lossless test on CUDA (tiny models, every offloadable architecture, lru/oracle/
#      on_demand; the full system matrix runs on CPU in `make test`);
#   2. `moebench calibrate --device cuda` (quick sweep) -> a hardware profile;
#   3. `moebench validate` on a DeepSeek-V2-Lite-shaped random-weight model in bf16 with a
#      24 GB budget and the trace's routing replayed (weights filled cheaply: values do not
#      matter), printing the TPOT and stall error of the simulator against the real run.
# Outputs go under $OUT when set (else results/gpu_check). Exits non-zero on the first failure.
# Env: PY (python with torch + transformers; default python3), LAYERS (MoE layers kept,
# default 26 = all), BUDGET_GB (default 24), SYSTEM (default lru), THREADS (default 8).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
OUT=${OUT:-results/gpu_check}
LAYERS=${LAYERS:-26}
BUDGET_GB=${BUDGET_GB:-24}
SYSTEM=${SYSTEM:-lru}
THREADS=${THREADS:-8}
mkdir -p "$OUT"
start=$(date +%s)
stamp() { echo "[gpu_check +$(( $(date +%s) - start ))s] $*" | tee -a "$OUT/gpu_check.log"; }

if ! "$PY" -c "import torch, transformers" 2>/dev/null; then
    stamp "$PY cannot import torch and transformers (set PY=... or pip install -e '.[torch]')"
    exit 2
fi
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    stamp "no CUDA device visible to torch: nothing to check here (run the CPU tests instead)"
    exit 2
fi
"$PY" -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))" \
    | tee "$OUT/device.txt"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true

stamp "1/3 lossless test on CUDA"
export CUBLAS_WORKSPACE_CONFIG=:4096:8
MOEBENCH_TEST_DEVICE=cuda timeout 200 "$PY" -m pytest tests/live/test_lossless.py -q -x \
    -k "lru or oracle or on_demand" -p no:cacheprovider 2>&1 | tee "$OUT/lossless.txt"

stamp "2/3 calibrate (quick sweep)"
timeout 120 "$PY" -m moebench.cli calibrate --device cuda --quick --threads "$THREADS" \
    --out "$OUT/calibration" --name gpu 2>&1 | tee "$OUT/calibrate.txt"
PROFILE="$OUT/calibration/hardware/gpu.yaml"
test -s "$PROFILE"

stamp "3/3 validate: DeepSeek-V2-Lite shape, $LAYERS MoE layers, bf16, ${BUDGET_GB} GB, $SYSTEM"
timeout 330 "$PY" -m moebench.cli validate --device cuda --dtype bfloat16 \
    --hardware "$PROFILE" --budget-gb "$BUDGET_GB" --num-moe-layers "$LAYERS" \
    --system "$SYSTEM" --requests 2 --prompt-len 128 --output-len 16 --threads "$THREADS" \
    --out "$OUT" 2>&1 | tee "$OUT/validate.txt"
stamp "done"
