"""Shared set-up for the asv suite: skip without a GPU, time with CUDA events."""

import importlib
import statistics
import time

import kaionb

# asv (run with --launch-method forkserver, benchmarks/run_asv.sh) imports this suite once
# and forks one process per benchmark and parameter: a baseline imported here is not
# imported again in each (with spawn, the H100 spent ~6 s per process, 426 s on the 70 of
# the matmul benchmark). A baseline that is not installed is fine here; the setups that
# need it import it after the GPU check and skip.
for _baseline in ("torch", "cupy"):
    try:
        importlib.import_module(_baseline)
    except ImportError:
        pass


def require_gpu():
    """asv skips a benchmark whose setup raises NotImplementedError."""
    if not kaionb.gpu_available():
        raise NotImplementedError("no CUDA GPU")


def median_ms(fn, *, warmup=5, repeats=50):
    """Median device time of ``fn`` in ms, each run bracketed by CUDA events."""
    from cuda.bindings import driver

    stream = kaionb.current_stream().handle
    start = driver.cuEventCreate(0)[1]
    stop = driver.cuEventCreate(0)[1]
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        driver.cuEventRecord(start, stream)
        fn()
        driver.cuEventRecord(stop, stream)
        driver.cuEventSynchronize(stop)
        times.append(driver.cuEventElapsedTime(start, stop)[1])
    driver.cuEventDestroy(start)
    driver.cuEventDestroy(stop)
    return statistics.median(times)


def batched_ms(fn, *, reps=20, batches=7):
    """Median ms per call of ``fn`` over ``batches`` batches of ``reps`` back-to-back calls
    bracketed by CUDA events: host time counts where it exceeds the GPU's (decode calls)."""
    from cuda.bindings import driver

    stream = kaionb.current_stream().handle
    start = driver.cuEventCreate(0)[1]
    stop = driver.cuEventCreate(0)[1]
    samples = []
    for _ in range(batches):
        driver.cuEventRecord(start, stream)
        for _ in range(reps):
            fn()
        driver.cuEventRecord(stop, stream)
        driver.cuEventSynchronize(stop)
        samples.append(driver.cuEventElapsedTime(start, stop)[1] / reps)
    driver.cuEventDestroy(start)
    driver.cuEventDestroy(stop)
    return statistics.median(samples)


def wall_seconds_per_call(fn, sync, calls, *, warmup=20):
    """Wall time per call of ``fn`` over ``calls`` back-to-back calls after ``warmup``
    calls, ``sync()`` (wait for the GPUs) before the clock starts and before it stops."""
    for _ in range(warmup):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t0) / calls
