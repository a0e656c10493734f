#!/usr/bin/env bash
# The asv suite on the GPU machine, in the Python that is already there (the device has no
# network, so asv cannot build its own environment), results saved under asv_results/ for
# the commit checked out here (or $ASV_COMMIT, a commit this repository has):
#
#   source .gpu/prelude.sh && bash benchmarks/run_asv.sh "$OUT/asv" [asv run arguments]
#
# The machine is named after the GPU (nvidia-h100-80gb-hbm3, ...). rounds=1: each track_*
# takes its own median of 50 CUDA-event-timed runs, so asv's second round of processes
# would only double the time. forkserver: the suite and its baselines are imported once
# (asv_benchmarks/common.py says why). Logs (appended) and a tarball of the results go to
# $1; a later run for the same commit adds to the results (--bench REGEX runs a part).
set -euo pipefail
cd "$(dirname "$0")/.."
logs=${1:-/tmp/asv}
shift || true
mkdir -p "$logs"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
machine=$(echo "$gpu" | tr 'A-Z ' 'a-z-')
# asv drops PYTHONPATH from the benchmark processes unless it comes as ASV_PYTHONPATH.
export ASV_PYTHONPATH=${PYTHONPATH:-}
python3 -m asv machine --yes --machine "$machine" --arch "$(uname -m)" \
  --cpu "$(lscpu | sed -n 's/^Model name: *//p' | head -n 1)" --num_cpu "$(nproc)" \
  --os "$(uname -sr)" --ram "$(free -b | awk '/^Mem:/ { print $2 }')" \
  > "$logs/machine.log" 2>&1
status=0
python3 -m asv run --environment "existing:$(command -v python3)" \
  --set-commit-hash "${ASV_COMMIT:-$(git rev-parse HEAD)}" --machine "$machine" -a rounds=1 \
  --launch-method "${ASV_LAUNCH_METHOD:-forkserver}" \
  --show-stderr "$@" 2>&1 | tee -a "$logs/run.log" || status=$?
tar -czf "$logs/asv_results.tar.gz" asv_results
exit $status
