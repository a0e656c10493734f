"""benchmarks/plot_results.py on a small asv result set written here with known numbers:
the series it reads back are those numbers, the newest run is the one plotted, a benchmark
without values leaves its figure out, and the figures are real, reproducible PNGs. The
reading part runs without matplotlib; the drawing part skips without it."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MACHINE = "nvidia-h100-80gb-hbm3"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
STARTED_MS = 1795700000000  # 2026-11-26 13:33:20 UTC

MATMUL_AXES = [["f16", "bf16"], ["1024", "2048", "decode1"]]
PRIMITIVES_AXES = [["rms_norm", "softmax"], [(16384, 8192), (64, 4096)],
                   ["float16", "float32"]]
CALL_AXES = [["rms_norm", "matmul_64"]]


def load_script():
    spec = importlib.util.spec_from_file_location(
        "plot_results", REPO / "benchmarks" / "plot_results.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


plot_results = load_script()


def write_run(results_dir, benchmarks, *, commit=COMMIT, started_ms=STARTED_MS,
              machine=MACHINE):
    """An asv (0.6, results version 2) results file and machine.json: ``benchmarks`` maps
    name -> (parameter axes, values in itertools.product order, or None: failed)."""
    folder = results_dir / machine
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "machine.json").write_text(json.dumps({"machine": machine, "version": 1}))
    columns = ["result", "params", "version", "started_at", "duration"]
    results = {name: [values, [[repr(p) for p in axis] for axis in axes], "0" * 64,
                      started_ms + i * 1000, 1.0]
               for i, (name, (axes, values)) in enumerate(benchmarks.items())}
    data = {"commit_hash": commit, "env_name": "existing-py_opt_torch_.venv_bin_python3",
            "date": started_ms - 86_400_000, "params": {"machine": machine},
            "python": "3.11", "requirements": {}, "env_vars": {},
            "result_columns": columns, "results": results, "durations": {}, "version": 2}
    path = folder / f"{commit[:8]}-existing-py_opt_torch_.venv_bin_python3.json"
    path.write_text(json.dumps(data))  # json writes NaN as asv does
    return path


MATMUL = {
    "matmul.TimeMatmul.track_tflops": (MATMUL_AXES, [58.7, 576.6, 2.08, 90.1, 590.2, 2.1]),
    "matmul.TimeMatmul.track_ratio_to_cublas": (MATMUL_AXES,
                                                [0.53, 0.86, 0.77, 0.56, 0.74, 0.81]),
    "matmul.TimeMatmul.track_mma_sync_ratio_to_cublas": (
        MATMUL_AXES, [0.57, 0.39, 0.81, 0.55, 0.38, math.nan]),  # one combination skipped
}
PRIMITIVES = {
    "primitives.Primitives.track_gbps": (
        PRIMITIVES_AXES, [2547.0, 2760.0, 300.0, 250.0, 2689.0, 2826.0, 310.0, 280.0]),
    "primitives.Primitives.track_fraction_of_copy": (
        PRIMITIVES_AXES, [0.88, 0.954, 1.0, 0.8, 0.929, 0.977, 0.9, 0.7]),
}
CALL_OVERHEAD = {
    "call_overhead.CallOverhead.track_kaionb_us_per_call": (CALL_AXES, [14.8, 12.2]),
    "call_overhead.CallOverhead.track_ratio_to_torch": (CALL_AXES, [0.5, 0.8]),
    "call_overhead.CallOverhead.track_graph_replay_us_per_op": (CALL_AXES, [2.4, 4.6]),
}
# A run where call_overhead failed (asv: result null) and a track was skipped (all NaN).
CALL_OVERHEAD_FAILED = {
    "call_overhead.CallOverhead.track_kaionb_us_per_call": (CALL_AXES, None),
    "call_overhead.CallOverhead.track_ratio_to_torch": (CALL_AXES, [math.nan, math.nan]),
    "call_overhead.CallOverhead.track_graph_replay_us_per_op": (CALL_AXES, None),
}


def test_series_are_the_numbers_written(tmp_path):
    write_run(tmp_path, MATMUL | PRIMITIVES | CALL_OVERHEAD)
    run = plot_results.find_run(tmp_path)
    assert (run.gpu, run.commit) == (MACHINE, COMMIT)

    matmul = plot_results.matmul_series(run)
    assert matmul["track_tflops"] == {
        ("f16", "1024"): 58.7, ("f16", "2048"): 576.6, ("f16", "decode1"): 2.08,
        ("bf16", "1024"): 90.1, ("bf16", "2048"): 590.2, ("bf16", "decode1"): 2.1}
    assert list(matmul["track_ratio_to_cublas"].values()) == [0.53, 0.86, 0.77, 0.56, 0.74,
                                                              0.81]
    mma_sync = matmul["track_mma_sync_ratio_to_cublas"]
    assert mma_sync[("f16", "2048")] == 0.39 and math.isnan(mma_sync[("bf16", "decode1")])

    primitives = plot_results.primitives_series(run)
    assert primitives["track_gbps"][("softmax", (16384, 8192), "float32")] == 2826.0
    assert primitives["track_fraction_of_copy"][("rms_norm", (64, 4096), "float32")] == 0.8
    # The copy's GB/s in the same process: the op's GB/s over its fraction of it.
    assert primitives["copy_gbps"][("rms_norm", (16384, 8192), "float16")] == pytest.approx(
        2547.0 / 0.88)
    assert len(primitives["copy_gbps"]) == 8

    calls = plot_results.call_overhead_series(run)
    assert calls["track_kaionb_us_per_call"] == {"rms_norm": 14.8, "matmul_64": 12.2}
    assert calls["track_graph_replay_us_per_op"] == {"rms_norm": 2.4, "matmul_64": 4.6}
    # track_ratio_to_torch is kaionb / torch, so torch's time is kaionb's over the ratio.
    assert calls["torch_us_per_call"] == pytest.approx({"rms_norm": 29.6, "matmul_64": 15.25})

    text = plot_results.footer(run, list(MATMUL))
    assert text.startswith(f"{MACHINE}, run of 2026-11-26 13:33 UTC, commit 01234567")
    assert text.endswith(plot_results.COMMANDS)


def test_failed_or_skipped_benchmark_has_no_values(tmp_path):
    write_run(tmp_path, MATMUL | CALL_OVERHEAD_FAILED)
    run = plot_results.find_run(tmp_path)
    for name in CALL_OVERHEAD_FAILED:
        assert plot_results.benchmark_values(run, name) is None
    assert plot_results.benchmark_values(run, "primitives.Primitives.track_gbps") is None


def test_newest_run_of_machine_and_commit(tmp_path):
    old = write_run(tmp_path, MATMUL, commit="a" * 40, started_ms=STARTED_MS - 3_600_000)
    new = write_run(tmp_path, MATMUL, commit="b" * 40)
    other = write_run(tmp_path, MATMUL, commit="c" * 40, started_ms=STARTED_MS + 60_000,
                      machine="nvidia-h200")
    assert plot_results.find_run(tmp_path).path == other
    assert plot_results.find_run(tmp_path, machine=MACHINE).path == new
    assert plot_results.find_run(tmp_path, MACHINE, commit="aaaa").path == old
    assert plot_results.find_run(tmp_path, MACHINE, commit="d") is None


def test_newest_run_holding_the_benchmarks(tmp_path):
    # A later run of part of the suite leaves a figure's benchmarks to the run that has
    # them (and that figure's footer names that run).
    full = write_run(tmp_path, MATMUL | PRIMITIVES, commit="a" * 40,
                     started_ms=STARTED_MS - 3_600_000)
    part = write_run(tmp_path, PRIMITIVES, commit="b" * 40)
    assert plot_results.find_run(tmp_path).path == part
    assert plot_results.find_run(tmp_path, needs=list(PRIMITIVES)).path == part
    run = plot_results.find_run(tmp_path, needs=list(MATMUL))
    assert run.path == full
    assert "commit aaaaaaaa" in plot_results.footer(run, list(MATMUL))
    assert plot_results.find_run(tmp_path, needs=list(CALL_OVERHEAD)) is None


def test_figures(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="drawing the figures needs matplotlib (the test "
                        "or bench extra)")
    import matplotlib.image

    results = tmp_path / "asv_results"
    write_run(results, MATMUL | PRIMITIVES | CALL_OVERHEAD_FAILED)
    written = plot_results.main(["--results-dir", str(results),
                                 "--output-dir", str(tmp_path / "figures")])
    assert [path.name for path in written] == ["matmul.png", "primitives.png"]
    assert not (tmp_path / "figures" / "call_overhead.png").exists()
    assert ("skipped call_overhead.png: no run holds results for "
            "call_overhead.CallOverhead.track_kaionb_us_per_call") in capsys.readouterr().out
    for path in written:
        assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
        image = matplotlib.image.imread(path)
        assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 800
        assert image[..., :3].min() < 0.2 and image[..., :3].max() > 0.9  # drawn on white
        assert len({tuple(pixel) for pixel in image[::7, ::7, :3].reshape(-1, 3)}) > 20

    # The same results give the same bytes (no timestamp or version in the PNG).
    again = plot_results.main(["--results-dir", str(results),
                               "--output-dir", str(tmp_path / "again")])
    assert [path.read_bytes() for path in again] == [path.read_bytes() for path in written]
