"""The tensor-parallel MLP examples, run as their users run them: two processes, one GPU
each, summing through NCCL (torch.distributed under torchrun, and CuPy's bindings). Each
must exit 0 and print its relative errors, every one under its tolerance."""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import kaionb

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 240  # two processes, first kernel compilations included
# What examples/tensor_parallel_mlp.py's report() prints, and the checks of two ranks.
CHECK_LINE = re.compile(r"(rank \d+: [^:\n]*): relative error (\S+) \(tolerance (\S+)\) "
                        r"(OK|FAIL)")
EXPECTED_CHECKS = {"rank 0: 2 GPUs vs float64", "rank 1: 2 GPUs vs float64",
                   "rank 0: 2 GPUs vs 1 GPU"}


def _require_two_gpus():
    if kaionb.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, this machine has {kaionb.device_count()}")


def _run_checks(*args) -> dict:
    """Run ``python args...`` from the repository root, the project importable the same
    way; return {check: relative error} after asserting exit 0 and every check OK."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    # A session of its own, so that a hang can be ended with every process it started.
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"{args[-1]} did not finish in {TIMEOUT_S} s:\n{output[-4000:]}")
    assert proc.returncode == 0, output[-4000:]
    checks = {}
    for what, err, tol, verdict in CHECK_LINE.findall(output):
        assert verdict == "OK" and float(err) <= float(tol), output[-4000:]
        checks[what] = float(err)
    return checks


def test_tensor_parallel_mlp_torchrun():
    _require_two_gpus()
    torch = pytest.importorskip("torch")
    if not (torch.distributed.is_available() and torch.distributed.is_nccl_available()):
        pytest.skip("this torch has no NCCL backend")
    checks = _run_checks("-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                         "2", "examples/tensor_parallel_mlp.py")
    assert set(checks) == EXPECTED_CHECKS, checks


def test_tensor_parallel_mlp_cupy_nccl():
    _require_two_gpus()
    pytest.importorskip("cupy")
    from cupy.cuda import nccl

    if not nccl.available:
        pytest.skip("CuPy finds no NCCL library")
    checks = _run_checks("examples/tensor_parallel_mlp_cupy.py")
    assert set(checks) == EXPECTED_CHECKS, checks
