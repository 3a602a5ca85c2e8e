#!/usr/bin/env bash
# The GPU checks of the open issues in one short run (sized for the device tool's 10-minute command and
# 15-minute session budget on one H100 / H200):
#   1. the contract suite's native-cuda rows, `tlt train` and `tlt train-drafter` on CUDA (pytest -m gpu),
#   2. #4: adaptive rollout vs SD-never vs each fixed strategy vs the reference buckets (eval.bench_adaptive), on
#      the main job's 12-layer policy and its EAGLE drafter (tlt/assets/deep_v1, in the repository: it travels
#      with the working tree),
#   3. #24: the main job on the GPU, one process: TLT vs TLT off, 12 GRPO steps each, step / rollout ratios and
#      the Amdahl bound (speedup.md).
#
# Prepare here once (CPU machine): the pure-Python packages the device image lacks (it has torch, transformers,
# lightning, matplotlib, tensorboard, pytest):
#   make gpu-wheels
# then run it there: device run, command `bash eval/gpu_checks.sh`, carry [".whl"], timeout 590 s (the steps'
# own timeouts sum to 550 s). Results, 8 files (markdown, PNG, logs: the device tool returns at most 8), land in
# $OUT, or runs/gpu-checks.
# A dry run on CPU: `QUICK=1 NO_WHEELS=1 TLT_CHECK_DEVICE=cpu PY=python OUT=/tmp/gc bash eval/gpu_checks.sh`.
set -uo pipefail

OUT=${OUT:-runs/gpu-checks}
PY=${PY:-python3}
DEVICE=${TLT_CHECK_DEVICE:-cuda}
mkdir -p "$OUT"
if [ "${QUICK:-0}" = 1 ]; then
  PROMPTS=4; SAMPLES=4; NEW=64; REPEATS=1; STEPS=2; HELDOUT=8; TRAIN_ARGS=(rollout.max_new_tokens=64 rollout.max_seq_len=192)
else
  PROMPTS=32; SAMPLES=8; NEW=512; REPEATS=2; STEPS=12; HELDOUT=256; TRAIN_ARGS=()
fi

if [ -d .whl ] && [ "${NO_WHEELS:-0}" != 1 ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
log() { echo "[gpu-checks $(date +%T)] $*" | tee -a "$OUT/steps.log"; }
status=0

log "environment"
{
  nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"
  "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, \
'cuda', torch.cuda.is_available() and torch.cuda.get_device_name())"
} 2>&1 | tee -a "$OUT/steps.log"

log "1/3 pytest -m gpu (native engine on $DEVICE against the CPU reference; tlt train on $DEVICE)"
timeout 120 "$PY" -m pytest -q -m gpu -rs -p no:cacheprovider tests/backends/test_contract.py \
  tests/training/test_train_cli.py tests/training/test_distill.py >"$OUT/tests.log" 2>&1 || status=1
tail -n 25 "$OUT/tests.log"

TARGET=tlt/assets/deep_v1/policy; DRAFTER=tlt/assets/deep_v1/drafter
log "2/3 #4 adaptive rollout benchmark on $TARGET ($PROMPTS prompts x $SAMPLES samples, T = 1, up to $NEW tokens)"
timeout 170 "$PY" -m eval.bench_adaptive --device "$DEVICE" --target "$TARGET" --drafter "$DRAFTER" \
  --strategies 3_1_4,5_1_6,7_1_8,4_2_8 --prompts "$PROMPTS" --samples "$SAMPLES" --max-new-tokens "$NEW" \
  --repeats "$REPEATS" --out /tmp/tlt-adaptive >"$OUT/adaptive.log" 2>&1 || status=1
cp /tmp/tlt-adaptive/adaptive.md /tmp/tlt-adaptive/adaptive_decisions.png "$OUT"/ 2>/dev/null
tail -n 30 "$OUT/adaptive.log"

log "3/3 #24 the main job, TLT vs TLT off, $STEPS GRPO steps each, one process"
rm -rf /tmp/tlt-qs
timeout 260 "$PY" -m tlt.cli train configs/quickstart.yaml train.device="$DEVICE" train.devices=1 \
  grpo.steps="$STEPS" train.heldout_eval="$HELDOUT" \
  train.tensorboard=false "${TRAIN_ARGS[@]}" --output-dir /tmp/tlt-qs >"$OUT/train.log" 2>&1 || status=1
cp /tmp/tlt-qs/speedup.md "$OUT"/ 2>/dev/null
cp /tmp/tlt-qs/summary.png "$OUT"/train_summary.png 2>/dev/null
tail -n 30 "$OUT/train.log"

log "done (status $status)"
exit $status
