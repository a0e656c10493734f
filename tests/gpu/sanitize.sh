#!/usr/bin/env bash
# compute-sanitizer over the reliability table (tests/reliability_calls.py): memcheck,
# racecheck, synccheck and initcheck, each tool in processes of its own, after one plain
# run that fills the on-disk kernel cache (the sanitized processes then load cubins
# instead of compiling). On the device machine:
#
#   source .gpu/prelude.sh && bash tests/gpu/sanitize.sh "$OUT/sanitize"            # all four
#   source .gpu/prelude.sh && bash tests/gpu/sanitize.sh "$OUT/sanitize" racecheck  # one tool
#
# The table runs as $SANITIZE_SHARDS shards side by side (default: half the CPUs, at most
# 8; the sanitizers' work is mostly on the CPU); a process still running after
# $SANITIZE_TIMEOUT seconds (default 150; the plain run gets at least 300, it may compile)
# is stopped. $SANITIZE_ONLY (a regex) runs only the entries whose name matches it (e.g.
# "stream" after a change to the weight-stream kernels; none matching is an error). Logs go
# to $1 (default /tmp/sanitize): per tool and shard, <tool>-<i>.log
# (entry markers, the sanitizer's reports), .json (kernels launched) and .rc (exit
# status). The end prints, per tool, the errors found and the kernels covered
# (tests/gpu/sanitize_driver.py summary). Exit status 1 if a tool reported an error or a
# process failed, 2 without compute-sanitizer.
set -uo pipefail
cd "$(dirname "$0")/../.."
logs=${1:-/tmp/sanitize}
[ $# -gt 0 ] && shift
tools=("$@")
[ ${#tools[@]} -gt 0 ] || tools=(memcheck racecheck synccheck initcheck)
for tool in "${tools[@]}"; do
  case $tool in
    memcheck | racecheck | synccheck | initcheck) ;;
    *) echo "sanitize.sh: unknown tool '$tool' (memcheck, racecheck, synccheck, initcheck)"
       exit 2 ;;
  esac
done
if ! command -v compute-sanitizer > /dev/null; then
  echo "sanitize.sh: compute-sanitizer is not on PATH (it comes with the CUDA toolkit, in its bin/)"
  exit 2
fi
half=$(( $(nproc) / 2 ))
shards=${SANITIZE_SHARDS:-$(( half < 1 ? 1 : half > 8 ? 8 : half ))}
limit=${SANITIZE_TIMEOUT:-150}
export PYTHONUNBUFFERED=1  # entry markers and reports interleave in the order they happen
mkdir -p "$logs"

# run_shards NAME LIMIT [WRAPPER...]: every shard of the table as WRAPPER python3 ..., side
# by side; NAME-<i>.{log,json,rc} in $logs.
run_shards() {
  local name=$1 seconds=$2 start=$SECONDS i
  shift 2
  rm -f "$logs/$name"-*
  for ((i = 0; i < shards; i++)); do
    (
      timeout -k 10 "$seconds" "$@" python3 tests/gpu/sanitize_driver.py run \
        --shard "$i/$shards" ${SANITIZE_ONLY:+--only "$SANITIZE_ONLY"} \
        --coverage "$logs/$name-$i.json" > "$logs/$name-$i.log" 2>&1
      echo $? > "$logs/$name-$i.rc"
    ) &
  done
  wait
  echo "$name: $((SECONDS - start)) s, $shards shards"
}

run_shards plain $(( limit > 300 ? limit : 300 ))
# --report-api-errors no: a failing CUDA call raises in Python (the entry fails, the
# process exits 1); the sanitizers are here for what kernels do.
common=(--error-exitcode 1 --target-processes all --report-api-errors no)
for tool in "${tools[@]}"; do
  case $tool in
    # kaionb's pool allocator and cached workspaces keep memory until exit: not leaks.
    memcheck) run_shards "$tool" "$limit" compute-sanitizer --tool memcheck "${common[@]}" \
                --leak-check no ;;
    *) run_shards "$tool" "$limit" compute-sanitizer --tool "$tool" "${common[@]}" ;;
  esac
done
python3 tests/gpu/sanitize_driver.py summary "$logs" plain "${tools[@]}"
