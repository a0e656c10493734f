#!/usr/bin/env bash
# The fuzz tests with the "gpu-long" hypothesis profile (2000 examples per op) in parallel
# groups (one pytest process each, spread over the GPUs), within one 10-minute device call:
#
#   source .gpu/prelude.sh && bash tests/run_fuzz_long.sh "$OUT/fuzz" [SECONDS]
#
# An op's examples stop running SECONDS after its first (default 100; KAIONB_FUZZ_SECONDS),
# kernel compilation included; a group holds at most 3 GPU ops, so it ends in about 3 ×
# SECONDS plus start-up and the draws of the examples not run (~8 minutes on one H100).
# The host-side fuzz (CPU only) runs beside them as one more group. Logs go to $1 (default
# /tmp/fuzz-long), one per group, with hypothesis's statistics; the summary at the end
# gives each test's examples run. A failure's log holds the shrunk case and its
# @reproduce_failure blob; the seed printed here replays the whole run
# (KAIONB_FUZZ_SEED=<seed> bash tests/run_fuzz_long.sh ..., or pytest --hypothesis-seed).
# Exits 1 if any group failed.
set -uo pipefail
cd "$(dirname "$0")/.."
logs=${1:-/tmp/fuzz-long}
export KAIONB_FUZZ_PROFILE=gpu-long KAIONB_FUZZ_SECONDS=${2:-${KAIONB_FUZZ_SECONDS:-100}}
seed=${KAIONB_FUZZ_SEED:-$(( (RANDOM << 15) | RANDOM ))}
mkdir -p "$logs"
gpus=$(nvidia-smi -L | wc -l)
op="tests/test_fuzz_ops.py::test_op_matches_float64"
groups=(  # the heaviest compilers (the matmul and attention families) spread out
  "$op[matmul] $op[random]"
  "$op[matmul_int8] $op[qkv_project_int8]"
  "$op[matmul_int4] $op[qkv_project_int4] $op[quantize_int4]"
  "$op[attention] $op[softmax]"
  "$op[attention_bwd] $op[rope]"
  "$op[norms] $op[norms_bwd] $op[activations]"
  "$op[elementwise] $op[quantize_int8]"
  "$op[reductions] $op[creation_and_take] $op[adamw_step]"
  "tests/test_fuzz_host.py"
)
echo "fuzz: profile gpu-long, ${KAIONB_FUZZ_SECONDS} s per op, seed $seed, logs in $logs"
pids=()
for i in "${!groups[@]}"; do
  # shellcheck disable=SC2086  # a group is a word list on purpose
  CUDA_VISIBLE_DEVICES=$((i % gpus)) python3 -m pytest -q -p no:cacheprovider \
    --hypothesis-seed="$seed" --hypothesis-show-statistics ${groups[$i]} \
    > "$logs/group-$i.log" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || status=1
done
# Per test: the examples drawn (passing + failing + invalid) times the share that ran.
for log in "$logs"/group-*.log; do
  echo "$(basename "$log"): $(tail -n 1 "$log")"
  awk '/^tests\/.*:$/ { test = $0 }
       / passing, .* failing, and .* invalid / { drawn = $2 + $4 + $7 }
       /%, ran$/ { printf "    %-72s %6d examples run\n", test, $2 * drawn / 100 + 0.5 }' "$log"
done
echo "seed $seed (KAIONB_FUZZ_SEED=$seed reruns these examples)"
exit $status
