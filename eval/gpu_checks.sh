#!/usr/bin/env bash
# The GPU checks in one short run, sized for the device tool (one command of at most 10 minutes, 15 minutes of
# device time per session): the steps' own time limits add up to 445 s (20 + 30 + 90 + 90 + 20 + 45 + 150).
#   0. environment and the carried policy: torch / transformers versions, the asset's files against its card's
#      sha256 (fails at once, with one line, if the working tree did not bring them),
#   1. pytest -m gpu: the contract suite's native-cuda rows, `tlt train` and `tlt train-drafter` on CUDA, and the
#      static-shape path captured as CUDA graphs against the CPU reference,
#   2. eval.bench_graphs: the native engine eager vs CUDA graphs at batch 1, 4, 16, 64, plain and SD (EAGLE,
#      4_1_5), on the main job's 12-layer policy and its drafter (tlt/assets/deep_v2, in the repository),
#   3. eval.bench_suffix_b1: the suffix drafter at batch 1 on prompts seen before, a chain against trees of 64 and
#      256 nodes (the widest reach 2.5 tokens per verify a pass later and lose on a CPU: do they pay on a GPU?),
#   4. the main job on the GPU, one process: TLT vs TLT off, 6 GRPO steps each (graphs on when step 2 matched the
#      eager tokens), whole-run and rollout ratios with r and the Amdahl bound,
#   then one summary table (summary.md).
#
# Prepare here once (CPU machine): the pure-Python packages the device image lacks (it has torch 2.11,
# transformers 5.17, lightning, matplotlib, tensorboard, pytest): `make gpu-wheels`; then run there: device run,
# command `bash eval/gpu_checks.sh`, carry [".whl"], timeout_s 480. Results (at most 8 files) land in $OUT, or
# runs/gpu-checks. Step 3 needs arctic-inference, which has no cp312 binary wheel: it is skipped unless .whl holds
# one built from the sdist by a Python 3.12 with torch installed (its setup.py imports torch; the suffix extension
# links only libstdc++): `pip wheel --no-deps --no-build-isolation -w .whl arctic-inference==0.3.0` with
# setuptools, ninja, cmake and nanobind==2.9.2 installed there.
# CPU dry run (a test: tests/test_gpu_checks.py): QUICK=1 NO_WHEELS=1 TLT_CHECK_DEVICE=cpu PY=python OUT=DIR bash eval/gpu_checks.sh
set -uo pipefail

OUT=${OUT:-runs/gpu-checks}
PY=${PY:-python3}
DEVICE=${TLT_CHECK_DEVICE:-cuda}
mkdir -p "$OUT"
if [ "${QUICK:-0}" = 1 ]; then
  SUFFIX_ARGS=(--prompts 2 --samples 2 --max-new-tokens 16 --rounds 1)
  BATCHES=1,4; NEW=16; ROUNDS=1; STEPS=1; HELDOUT=4; TRAIN_ARGS=(rollout.max_new_tokens=32 rollout.max_seq_len=192 rollout.prompts_per_step=2 rollout.samples_per_prompt=2)
else
  SUFFIX_ARGS=(--prompts 4 --samples 8 --max-new-tokens 128 --rounds 2)
  BATCHES=1,4,16,64; NEW=64; ROUNDS=3; STEPS=6; HELDOUT=64; TRAIN_ARGS=()
fi

if [ -d .whl ] && [ "${NO_WHEELS:-0}" != 1 ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
log() { echo "[gpu-checks $(date +%T)] $*" | tee -a "$OUT/steps.log"; }
status=0

log "0/4 environment and the carried policy"
{
  nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"
  timeout 20 "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', \
transformers.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name())"
} 2>&1 | tee -a "$OUT/steps.log"
if ! timeout 30 "$PY" -c "from tlt.assets import verify; verify('deep_v2')" >>"$OUT/steps.log" 2>&1; then
  log "FAILED: tlt/assets/deep_v2 is missing or does not match its card (did the working tree travel whole?)"
  tail -n 3 "$OUT/steps.log"
  exit 2
fi

log "1/4 pytest -m gpu (native engine on $DEVICE against the CPU reference, CUDA graphs, tlt train on $DEVICE)"
timeout 90 "$PY" -m pytest -q -m gpu -rs -p no:cacheprovider tests/backends/test_contract.py \
  tests/backends/test_native_graphs.py tests/training/test_train_cli.py tests/training/drafter/test_distill.py \
  >"$OUT/tests.log" 2>&1 || status=1
tail -n 15 "$OUT/tests.log"

TARGET=tlt/assets/deep_v2/policy; DRAFTER=tlt/assets/deep_v2/drafter
log "2/4 native engine eager vs static shapes / CUDA graphs on $TARGET (batches $BATCHES, $ROUNDS rounds)"
GRAPHS=false
if timeout 90 "$PY" -m eval.bench_graphs --device "$DEVICE" --target "$TARGET" --drafter "$DRAFTER" \
  --batches "$BATCHES" --new-tokens "$NEW" --rounds "$ROUNDS" --out "$OUT" >"$OUT/graphs.log" 2>&1; then
  GRAPHS=true
else
  status=1
fi
tail -n 20 "$OUT/graphs.log"

log "3/4 the suffix drafter at batch 1 on $DEVICE: a chain against trees of 64 and 256 nodes"
rm -rf /tmp/tlt-suffix  # its files stay there (at most 8 files come back from $OUT); summary.md holds its table
if timeout 20 "$PY" -c "import arctic_inference.suffix_decoding._C" 2>/dev/null; then
  timeout 45 "$PY" -m eval.bench_suffix_b1 --device "$DEVICE" --target "$TARGET" "${SUFFIX_ARGS[@]}" \
    --arms chain_5,tree_15_4_64,tree_31_8_256 --out /tmp/tlt-suffix >/tmp/tlt-suffix.log 2>&1 || status=1
  tail -n 8 /tmp/tlt-suffix.log
else
  log "skipped: no arctic-inference there (no cp312 binary wheel exists; see the header)"
fi

log "4/4 the main job, TLT vs TLT off, $STEPS GRPO steps each, one process, rollout.cuda_graphs=$GRAPHS"
rm -rf /tmp/tlt-qs
timeout 150 "$PY" -m tlt.cli train configs/quickstart.yaml train.device="$DEVICE" train.devices=1 \
  grpo.steps="$STEPS" train.compare_turn_steps="$STEPS" train.heldout_eval="$HELDOUT" train.tensorboard=false \
  rollout.cuda_graphs="$GRAPHS" "${TRAIN_ARGS[@]}" --output-dir /tmp/tlt-qs >"$OUT/train.log" 2>&1 || status=1
cp /tmp/tlt-qs/speedup.md "$OUT"/ 2>/dev/null
tail -n 8 "$OUT/train.log"

log "summary (status $status)"
"$PY" - "$OUT" /tmp/tlt-qs/speedup.json /tmp/tlt-suffix/suffix_b1.md <<'EOF' | tee "$OUT/summary.md"
import json, sys
from pathlib import Path

out, speedup, suffix = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
print((out / "graphs.md").read_text() if (out / "graphs.md").exists() else "eager vs graphs: no result (graphs.log)")
print(suffix.read_text() if suffix.exists() else "suffix drafter at batch 1: no result (/tmp/tlt-suffix.log)")
if speedup.exists():
    s = json.loads(speedup.read_text())
    print("| main job, TLT vs TLT off | whole run | rollout s | r | Amdahl bound | median step |")
    print("|---|---|---|---|---|---|")
    print(f"| {s['measured_steps']} steps | {s['run_ratio']:.2f}x | {s['run_rollout_speedup']:.2f}x | "
          f"{s['run_rollout_share']:.0%} | {s['run_amdahl_bound']:.2f}x | {s['speedup']:.2f}x |")
else:
    print("main job: no result (train.log)")
EOF
exit $status
