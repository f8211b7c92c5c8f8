#!/usr/bin/env bash
# Reproduce the whole measurement (about 90-120 min on 2 busy CPU cores). Work files: $WORK.
# The RF side is whatever `trl_rapidfire` the venv imports; put a snapshot first on PYTHONPATH
# to pin it (the README's figures: see there).
set -euo pipefail
export WORK=${WORK:-/tmp/trl_own_tests}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/work/main/.venv/bin/python
mkdir -p "$WORK/trl_src" "$WORK/logs"
# 1. TRL source snapshot (bare mirror made by the `fetch` tool: github:huggingface/trl, HEAD f2cd5771)
GIT_DIR=${TRL_GIT_DIR:-/work/.mirror/huggingface+trl/repo}
git --git-dir="$GIT_DIR" archive HEAD tests/__init__.py tests/conftest.py tests/testing_utils.py \
  tests/testing_constants.py tests/test_sft_trainer.py tests/test_dpo_trainer.py tests/test_grpo_trainer.py \
  tests/test_kto_trainer.py tests/test_reward_trainer.py tests/test_rloo_trainer.py \
  tests/experimental/__init__.py tests/experimental/test_distillation_trainer.py \
  tests/data scripts | tar x -C "$WORK/trl_src"
# 2. offline Hub stand-ins (tiny models + tokenizers in a Hub cache, TRL's datasets as parquet)
OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 nice -n 19 $PY "$HERE/build_assets.py"
# 3. the two test trees: plain/ and rf/ (imports swapped)
nice -n 19 $PY "$HERE/prepare.py"
# 4. one process per file, plain and swapped (two streams in parallel)
python3 "$HERE/run.py" one --flavour plain --files sft,dpo,grpo > "$WORK/logs/one-plain.out" 2>&1 &
python3 "$HERE/run.py" one --flavour rf    --files sft,dpo,grpo > "$WORK/logs/one-rf.out" 2>&1 &
wait
# 4b. KTO, Reward, RLOO, Distillation: plain then swapped, one file at a time (one stream)
for f in kto reward rloo distill; do
  for flavour in plain rf; do
    python3 "$HERE/run.py" one --flavour $flavour --files $f >> "$WORK/logs/one-$flavour.out" 2>&1
  done
done
# 5. fresh process per test: every 6th (dpo, sft) / 10th (grpo) of the plain one-process passes
python3 "$HERE/run.py" fresh --flavour plain --every 6 --from-passed --files dpo,sft > "$WORK/logs/fresh-plain.out" 2>&1 &
python3 "$HERE/run.py" fresh --flavour rf    --every 6 --from-passed --files dpo,sft > "$WORK/logs/fresh-rf.out" 2>&1 &
wait
python3 "$HERE/run.py" fresh --flavour plain --every 10 --from-passed --files grpo > "$WORK/logs/fresh-plain-grpo.out" 2>&1 &
python3 "$HERE/run.py" fresh --flavour rf    --every 10 --from-passed --files grpo > "$WORK/logs/fresh-rf-grpo.out" 2>&1 &
wait
# 6. counts and grouped differences
python3 "$HERE/report.py"
