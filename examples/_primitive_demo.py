"""Shared by the primitive examples: check one op against its NumPy reference, then time
it (CUDA events through kaionb's default stream, median of 50 calls) and print GB/s."""

import statistics
import sys
import time


import kaionb
from kaionb.testing import assert_close


def no_gpu_exit():
    if not kaionb.gpu_available():
        print("no CUDA GPU on this machine: nothing to run (the example needs one)")
        sys.exit(0)


def check_and_time(name, call, ref, dtype, nbytes):
    """``call()`` returns a DeviceArray; ``ref`` the float64 expectation."""
    err = assert_close(call(), ref, dtype=dtype)
    call()
    kaionb.current_stream().synchronize()
    times = []
    for _ in range(50):
        t0 = time.perf_counter()
        call()
        kaionb.current_stream().synchronize()
        times.append(time.perf_counter() - t0)
    us = statistics.median(times) * 1e6
    print(f"{name}: relative error {err:.1e} vs float64 NumPy; {us:.1f} us per call end to "
          f"end, {nbytes / us / 1e3:.0f} GB/s")
    return err
