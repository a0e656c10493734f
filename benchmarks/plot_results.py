"""Figures for docs/performance.md from the committed asv results (asv_results/): matmul
TFLOP/s and ratio to cuBLAS, the primitives' bandwidth against a device-to-device copy,
and the time per call against torch.

    bash benchmarks/run_asv.sh                 # on the GPU machine: asv_results/<gpu>/
    python benchmarks/plot_results.py [--results-dir asv_results] [--machine NAME]
                                      [--commit PREFIX] [--output-dir docs/figures]

Each figure is drawn from one results file, read as plain JSON without asv: the newest
run (of --machine and --commit when given) that holds its benchmarks — a run of part of
the suite leaves the other figures to older runs. Writes matmul.png, primitives.png and call_overhead.png, each with the
GPU (asv's machine name), the date of the run, the commit and the commands in its footer.
A figure whose benchmarks hold no finite value (a failed or skipped run) is left out with
a note. Drawing needs matplotlib (the ``bench`` extra); reading the results does not.
"""

import argparse
import ast
import datetime
import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMANDS = "bash benchmarks/run_asv.sh; python benchmarks/plot_results.py"

MATMUL = "matmul.TimeMatmul."
MATMUL_METRICS = ["track_tflops", "track_ratio_to_cublas", "track_mma_sync_ratio_to_cublas"]
PRIMITIVES = "primitives.Primitives."
PRIMITIVES_METRICS = ["track_gbps", "track_fraction_of_copy"]
CALL_OVERHEAD = "call_overhead.CallOverhead."
CALL_OVERHEAD_METRICS = ["track_kaionb_us_per_call", "track_ratio_to_torch",
                         "track_graph_replay_us_per_op"]


@dataclass(frozen=True)
class Run:
    """One asv results file: the GPU it ran on, the commit, and per benchmark the columns
    asv stores (result, params, started_at, ...)."""

    path: Path
    gpu: str
    commit: str
    benchmarks: dict

    @classmethod
    def load(cls, path):
        data = json.loads(Path(path).read_text())  # asv writes NaN, which json reads
        benchmarks = {name: dict(zip(data["result_columns"], row))
                      for name, row in data["results"].items()}
        return cls(Path(path), data["params"]["machine"], data["commit_hash"], benchmarks)

    def started_ms(self, names):
        """Earliest start (ms since the epoch) of the named benchmarks."""
        return min(self.benchmarks[name]["started_at"] for name in names)


def find_run(results_dir, machine=None, commit=None, needs=()):
    """The results file under ``results_dir`` of the newest run (latest benchmark start),
    of ``machine`` and of a commit starting with ``commit`` when given, holding values
    for every benchmark named in ``needs`` (a run of part of the suite lacks the rest).
    None when no run qualifies."""
    # asv_results/<machine>/ holds machine.json beside the results files.
    runs = [Run.load(path) for path in sorted(Path(results_dir).glob(f"{machine or '*'}/*.json"))
            if path.name != "machine.json"]
    runs = [run for run in runs if run.commit.startswith(commit or "")
            and all(benchmark_values(run, name) is not None for name in needs)]
    if not runs:
        return None
    # A run for the same commit can add to the file later; its last start is its newest.
    return max(runs, key=lambda run: max(
        (row.get("started_at") or 0 for row in run.benchmarks.values()), default=0))


def benchmark_values(run, name):
    """{parameter tuple: value} of one benchmark in asv's order, NaN where a combination
    failed or was skipped; None when it has no finite value at all."""
    row = run.benchmarks.get(name)
    if row is None or row.get("result") is None:  # a failed benchmark: result is null
        return None
    # asv stores each parameter as its repr ("'f16'", "(16384, 8192)").
    axes = [[ast.literal_eval(value) for value in axis] for axis in row["params"]]
    values = {combo: math.nan if value is None else float(value)
              for combo, value in zip(itertools.product(*axes), row["result"])}
    return values if any(math.isfinite(v) for v in values.values()) else None


def _metrics(run, prefix, metrics):
    return {metric: benchmark_values(run, prefix + metric) for metric in metrics}


def matmul_series(run):
    """{metric: {(dtype, shape): value}} of TimeMatmul's track_tflops, track_ratio_to_cublas
    (cuBLAS time / kaionb.matmul's) and track_mma_sync_ratio_to_cublas."""
    return _metrics(run, MATMUL, MATMUL_METRICS)


def primitives_series(run):
    """{metric: {(op, shape, dtype): value}}: track_gbps, track_fraction_of_copy and
    copy_gbps, the copy's GB/s in the same process (track_gbps / track_fraction_of_copy)."""
    series = _metrics(run, PRIMITIVES, PRIMITIVES_METRICS)
    fraction = series["track_fraction_of_copy"]
    series["copy_gbps"] = {key: gbps / fraction[key]
                           for key, gbps in series["track_gbps"].items()}
    return series


def call_overhead_series(run):
    """{metric: {op: value}}: CallOverhead's three tracks and torch_us_per_call, kaionb's µs
    over the ratio (kaionb / torch). The ratio times kaionb again, so the derived torch
    time carries the difference between two measurements of kaionb's call."""
    series = {metric: {op: value for (op,), value in values.items()}
              for metric, values in _metrics(run, CALL_OVERHEAD, CALL_OVERHEAD_METRICS).items()}
    ratio = series["track_ratio_to_torch"]
    series["torch_us_per_call"] = {op: us / ratio[op]
                                   for op, us in series["track_kaionb_us_per_call"].items()}
    return series


def footer(run, names):
    started = datetime.datetime.fromtimestamp(run.started_ms(names) / 1000,
                                               datetime.timezone.utc)
    return (f"{run.gpu}, run of {started:%Y-%m-%d %H:%M} UTC, commit {run.commit[:8]}"
            f"  |  {COMMANDS}")


def _unique(keys, position):
    return list(dict.fromkeys(key[position] for key in keys))


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, text, path, top=1.0):
    """Footer ``text`` under the panels (which end at ``top``), then a reproducible PNG."""
    fig.text(0.5, 0.01, text, ha="center", va="bottom", fontsize=8, color="0.35")
    fig.tight_layout(rect=(0, 0.04, 1, top))
    # No Software key (matplotlib's version): the same results give the same bytes.
    fig.savefig(path, dpi=100, metadata={"Software": None})
    _pyplot().close(fig)


def plot_matmul(series, text, path):
    plt = _pyplot()
    tflops = series["track_tflops"]
    ratio, mma_sync = series["track_ratio_to_cublas"], series["track_mma_sync_ratio_to_cublas"]
    dtypes, shapes = _unique(tflops, 0), _unique(tflops, 1)
    square = [shape for shape in shapes if shape.isdigit()]  # M = N = K; the rest: decode
    decode = [shape for shape in shapes if not shape.isdigit()]
    sizes = [int(shape) for shape in square]
    colours = {dtype: f"C{i}" for i, dtype in enumerate(dtypes)}
    fig, (ax_tflops, ax_ratio, ax_decode) = plt.subplots(1, 3, figsize=(16, 5))
    fig.suptitle("Tensor-core matmul against cuBLAS (torch.matmul), f32 accumulation")
    for dtype in dtypes:
        ax_tflops.plot(sizes, [tflops[dtype, s] for s in square], "o-",
                       color=colours[dtype], label=f"kaionb.matmul {dtype}")
        ax_ratio.plot(sizes, [ratio[dtype, s] for s in square], "o-",
                      color=colours[dtype], label=f"kaionb.matmul {dtype}")
        ax_ratio.plot(sizes, [mma_sync[dtype, s] for s in square], "s--",
                      color=colours[dtype], alpha=0.6, label=f"mma.sync kernel {dtype}")
    for ax in (ax_tflops, ax_ratio):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(size) for size in sizes])
        ax.set_xlabel("M = N = K")
        ax.grid(alpha=0.3)
    ax_tflops.set_ylabel("TFLOP/s")
    ax_tflops.set_ylim(bottom=0)
    ax_tflops.set_title("kaionb.matmul throughput")
    ax_ratio.axhline(1.0, color="k", lw=1, label="cuBLAS")
    ax_ratio.set_ylabel("cuBLAS time / kaionb time (> 1: faster)")
    ax_ratio.set_title("ratio to cuBLAS")
    ax_tflops.legend()
    ax_ratio.legend(fontsize=8)
    if decode:
        bars = [(f"kaionb.matmul {dtype}", ratio, dtype, 1.0) for dtype in dtypes]
        bars += [(f"mma.sync kernel {dtype}", mma_sync, dtype, 0.5) for dtype in dtypes]
        width = 0.8 / len(bars)
        for i, (label, values, dtype, alpha) in enumerate(bars):
            xs = [j + (i - (len(bars) - 1) / 2) * width for j in range(len(decode))]
            drawn = ax_decode.bar(xs, [values[dtype, s] for s in decode], width,
                                  color=colours[dtype], alpha=alpha, label=label)
            if values is ratio:  # kaionb.matmul's own throughput over its bars
                ax_decode.bar_label(drawn, [f"{tflops[dtype, s]:.0f}" for s in decode],
                                    fontsize=7)
        ax_decode.axhline(1.0, color="k", lw=1)
        ax_decode.set_xticks(range(len(decode)), decode)
        ax_decode.set_ylabel("cuBLAS time / kaionb time")
        ax_decode.set_title("decode shapes: ratio to cuBLAS (TFLOP/s over bars)")
        ax_decode.legend(fontsize=8)
    else:
        ax_decode.remove()
    _save(fig, text, path)


def plot_primitives(series, text, path):
    plt = _pyplot()
    gbps, fraction = series["track_gbps"], series["track_fraction_of_copy"]
    copy = series["copy_gbps"]
    ops, shapes, dtypes = _unique(gbps, 0), _unique(gbps, 1), _unique(gbps, 2)
    fig, axes = plt.subplots(2, len(shapes), figsize=(5.5 * len(shapes), 8), sharex=True,
                             squeeze=False)
    fig.suptitle("Transformer primitives: achieved bandwidth against a device-to-device "
                 "copy in the same process")
    width = 0.8 / len(dtypes)
    for column, shape in enumerate(shapes):
        ax_gbps, ax_fraction = axes[0, column], axes[1, column]
        for i, dtype in enumerate(dtypes):
            xs = [j + (i - (len(dtypes) - 1) / 2) * width for j in range(len(ops))]
            keys = [(op, shape, dtype) for op in ops]
            ax_gbps.bar(xs, [gbps[key] for key in keys], width, color=f"C{i}", label=dtype)
            ax_gbps.hlines([copy[key] for key in keys], [x - width / 2 for x in xs],
                           [x + width / 2 for x in xs], color="k", lw=1.5,
                           label="copy" if i == 0 else None)
            ax_fraction.bar(xs, [fraction[key] for key in keys], width, color=f"C{i}")
        ax_gbps.set_title(" × ".join(map(str, shape)))
        ax_gbps.set_ylabel("GB/s (copy: black mark)")
        ax_fraction.axhline(1.0, color="k", lw=1, label="copy")
        ax_fraction.axhline(0.9, color="k", lw=1, ls="--", label="target 0.9")
        ax_fraction.set_ylabel("fraction of copy GB/s")
        ax_fraction.set_xticks(range(len(ops)), ops, rotation=40, ha="right")
        for ax in (ax_gbps, ax_fraction):
            ax.grid(axis="y", alpha=0.3)
    # One legend for all panels, above them: inside a panel it would cover bars.
    legend = {}  # label -> handle; "copy" (a black line) once for both rows
    for ax in axes[:, 0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    fig.legend(legend.values(), legend.keys(), loc="upper center", ncol=len(legend),
               bbox_to_anchor=(0.5, 0.955))
    _save(fig, text, path, top=0.92)


def plot_call_overhead(series, text, path):
    plt = _pyplot()
    ours, torch_us = series["track_kaionb_us_per_call"], series["torch_us_per_call"]
    graph, ratio = series["track_graph_replay_us_per_op"], series["track_ratio_to_torch"]
    ops = list(ours)
    fig, (ax_us, ax_ratio) = plt.subplots(1, 2, figsize=(15, 5),
                                          gridspec_kw={"width_ratios": [1.6, 1]})
    fig.suptitle("Time per call at decode sizes: kaionb against torch, and CUDA-graph replay")
    bars = [("kaionb", ours), ("torch (kaionb / ratio)", torch_us),
            ("kaionb graph replay, per op", graph)]
    width = 0.8 / len(bars)
    for i, (label, values) in enumerate(bars):
        xs = [j + (i - (len(bars) - 1) / 2) * width for j in range(len(ops))]
        ax_us.bar(xs, [values[op] for op in ops], width, color=f"C{i}", label=label)
    ax_us.set_ylabel("µs per call (wall time)")
    ax_us.legend(fontsize=8)
    ax_ratio.bar(range(len(ops)), [ratio[op] for op in ops], color="C0")
    ax_ratio.axhline(1.0, color="k", lw=1, label="torch")
    ax_ratio.axhline(0.5, color="k", lw=1, ls="--", label="target 0.5")
    ax_ratio.set_ylabel("kaionb time / torch time (< 1: faster)")
    ax_ratio.legend(fontsize=8)
    for ax in (ax_us, ax_ratio):
        ax.set_xticks(range(len(ops)), ops, rotation=40, ha="right")
        ax.grid(axis="y", alpha=0.3)
    _save(fig, text, path)


@dataclass(frozen=True)
class Figure:
    """A PNG: the benchmarks it needs, the series read from them, how it is drawn."""

    filename: str
    benchmarks: list
    series: Callable
    plot: Callable


FIGURES = [
    Figure("matmul.png", [MATMUL + m for m in MATMUL_METRICS], matmul_series, plot_matmul),
    Figure("primitives.png", [PRIMITIVES + m for m in PRIMITIVES_METRICS], primitives_series,
           plot_primitives),
    Figure("call_overhead.png", [CALL_OVERHEAD + m for m in CALL_OVERHEAD_METRICS],
           call_overhead_series, plot_call_overhead),
]


def main(argv=None):
    """Write the figures; returns their paths."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results-dir", type=Path, default=REPO / "asv_results")
    parser.add_argument("--machine", help="asv machine name (default: the newest run's)")
    parser.add_argument("--commit", help="commit hash prefix (default: the newest run's)")
    parser.add_argument("--output-dir", type=Path, default=REPO / "docs" / "figures")
    args = parser.parse_args(argv)
    try:
        _pyplot()
    except ImportError:
        raise SystemExit("plot_results.py needs matplotlib (pip install matplotlib, or the "
                         "bench extra)") from None
    if find_run(args.results_dir, args.machine, args.commit) is None:
        raise SystemExit(f"no asv results in {args.results_dir}"
                         + (f" for machine {args.machine}" if args.machine else "")
                         + (f" for commit {args.commit}" if args.commit else ""))
    written = []
    for figure in FIGURES:
        run = find_run(args.results_dir, args.machine, args.commit, figure.benchmarks)
        if run is None:
            print(f"skipped {figure.filename}: no run holds results for "
                  f"{', '.join(figure.benchmarks)}")
            continue
        args.output_dir.mkdir(parents=True, exist_ok=True)  # not for a run with no data
        path = args.output_dir / figure.filename
        figure.plot(figure.series(run), footer(run, figure.benchmarks), path)
        print(f"wrote {path} from {run.path.name} ({run.gpu}, commit {run.commit[:8]})")
        written.append(path)
    return written


if __name__ == "__main__":
    main()
