#!/usr/bin/env bash
# The whole GPU suite in parallel groups (one pytest process each, spread over the GPUs),
# as it runs on the device machine within one 10-minute call (most of the time is kernel
# compilation, which a single process does one kernel at a time):
#
#   source .gpu/prelude.sh && bash tests/run_gpu_suite.sh "$OUT"
#
# Logs go to $1 (default: /tmp/gpu-suite), one per group, and a summary line per group is
# printed at the end; exits 1 if any group failed. test_compile_all (the CPU ptxas check)
# is left to CI. Tests that need two GPUs run last, alone, with every GPU visible.
set -uo pipefail
cd "$(dirname "$0")/.."
logs=${1:-/tmp/gpu-suite}
mkdir -p "$logs"
gpus=$(nvidia-smi -L | wc -l)
groups=(
  "tests/test_matmul.py"
  "tests/test_matmul_w8a8.py tests/test_qkv_project_int8.py tests/test_matmul_int4.py"
  "tests/test_attention.py tests/test_quantize.py tests/test_rope.py tests/test_adamw.py"
  "tests/test_norms.py tests/test_norms_bwd.py tests/test_activations.py"
  "tests/test_softmax.py tests/test_array_gpu.py tests/test_block_cache.py tests/test_array_host.py tests/test_call_path.py tests/test_graphs.py tests/test_grad.py tests/test_kernel_cache.py tests/test_kernel_helpers.py tests/test_op_skeleton.py tests/test_ptx_patches.py tests/test_random.py tests/test_bad_inputs.py"
  "tests/test_attention_bwd.py"
  "tests/test_array_api.py"
  "tests/test_reductions.py::test_every_op_and_dtype"
  "tests/test_reductions.py::test_columns_read_in_words"
  "tests/test_reductions.py::test_axis_cases tests/test_reductions.py::test_non_contiguous_views"
  "tests/test_reductions.py --deselect tests/test_reductions.py::test_every_op_and_dtype --deselect tests/test_reductions.py::test_columns_read_in_words --deselect tests/test_reductions.py::test_axis_cases --deselect tests/test_reductions.py::test_non_contiguous_views"
  "tests/test_determinism.py tests/test_soak.py"
  "tests/test_fuzz_ops.py tests/test_fuzz_host.py"
)
# With one GPU the device tests run beside the others (after them they were cut off by
# the 10-minute call on 2026-11-27: the longest group took 534 s).
if [ "$gpus" -lt 2 ]; then
  groups+=("tests/test_devices.py")
fi
pids=()
for i in "${!groups[@]}"; do
  # shellcheck disable=SC2086  # a group is a word list on purpose
  CUDA_VISIBLE_DEVICES=$((i % gpus)) python3 -m pytest -q -p no:cacheprovider ${groups[$i]} \
    > "$logs/group-$i.log" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || status=1
done
if [ "$gpus" -ge 2 ]; then
  python3 -m pytest -q -p no:cacheprovider tests/test_devices.py tests/test_multi_gpu_examples.py \
    > "$logs/group-multi-gpu.log" 2>&1 || status=1
fi
for log in "$logs"/group-*.log; do
  echo "$(basename "$log"): $(tail -n 1 "$log")"
done
exit $status
