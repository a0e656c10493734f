"""The process tests/gpu/sanitize.sh runs under compute-sanitizer, and its summary.

    python tests/gpu/sanitize_driver.py run [--shard I/N] [--only REGEX] [--coverage FILE]
    python tests/gpu/sanitize_driver.py summary LOGDIR TOOL...

``run`` builds and runs every entry of the reliability table (tests/reliability_calls.py)
that this GPU runs — entries I, I + N, ... with ``--shard``, those whose name matches
``--only`` — once each, and reads every
output back (so initcheck sees an output element no kernel wrote, and each report lands
under the entry's ``[entry] name`` line in the log, before the next entry starts), and
writes the kernels each entry launched to ``--coverage`` (JSON). An entry that raises is
reported and the others still run; the exit status is 1 if any raised.

``summary`` reads LOGDIR/<tool>-<shard>.{log,json,rc} as sanitize.sh leaves them and
prints, per tool: the errors compute-sanitizer counted, the entries under whose line it
reported something, and the kernel variants launched against those registered (per
module; the full list in LOGDIR/<tool>-covered.txt). Exit status 1 if a tool counted an
error or a process failed.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]  # reliability_calls, and this checkout's kaionb

import reliability_calls as rc  # noqa: E402
from kaionb._device import compute_capability  # noqa: E402

MARK = "[entry] "
# compute-sanitizer's lines start with "========= ". The tools end with an ERROR SUMMARY,
# racecheck (also, or only) with a RACECHECK SUMMARY; a report starts with an unindented
# line, the lines that continue it are indented.
SUMMARY = re.compile(r"^========= ERROR SUMMARY: (\d+) errors?")
RACECHECK = re.compile(r"^========= RACECHECK SUMMARY: .*\((\d+) errors?, (\d+) warnings?\)")
REPORT = re.compile(r"^========= (?!ERROR SUMMARY|RACECHECK SUMMARY|COMPUTE-SANITIZER"
                    r"|Target application returned)\S")


def run(shard: str, coverage_file: str | None, only: str | None = None) -> int:
    cc = compute_capability()
    chosen = [e for e in rc.calls() if only is None or re.search(only, e.name)]
    if not chosen:
        print(f"no entry of the reliability table matches --only {only!r}", flush=True)
        return 1
    entries = rc.shard(chosen, shard)
    launched, failed, skipped = {}, [], []
    for entry in entries:
        if not entry.runs_on(cc):
            skipped.append(entry.name)
            continue
        print(MARK + entry.name, flush=True)
        with rc.recorded_launches() as kernels:
            try:
                for a in rc.arrays(rc.run_entry(entry)):
                    a.get()  # waits for the GPU: the entry's reports come before the next mark
            except Exception:
                traceback.print_exc()
                failed.append(entry.name)
        launched[entry.name] = sorted(kernels)
    print(f"{len(launched)} entries run, {len(skipped)} skipped on cc {cc}, "
          f"{len(failed)} failed{': ' + ', '.join(failed) if failed else ''}", flush=True)
    if coverage_file:
        Path(coverage_file).write_text(json.dumps(
            {"cc": list(cc), "launched": launched, "failed": failed, "skipped": skipped}))
    return 1 if failed else 0


def _reports(log: Path):
    """(errors, racecheck warnings, entries with a report under their line, whether a
    summary line was seen) of one sanitized log. Errors: the ERROR SUMMARY's count, else
    the RACECHECK SUMMARY's."""
    summary = race = None
    warnings, entries, entry = 0, [], None
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith(MARK):
            entry = line[len(MARK):]
        elif m := SUMMARY.match(line):
            summary = (summary or 0) + int(m.group(1))
        elif m := RACECHECK.match(line):
            race = (race or 0) + int(m.group(1))
            warnings += int(m.group(2))
        elif REPORT.match(line) and entry and entry not in entries:
            entries.append(entry)
    errors = summary if summary is not None else race or 0
    return errors, warnings, entries, summary is not None or race is not None


def summary(logdir: str, tools: list[str]) -> int:
    logs = Path(logdir)
    kernels = rc.registered()
    module_of = {key: k.pyfunc.__module__.rsplit(".", 1)[-1] for key, k in kernels.items()}
    status = 0
    for tool in tools:
        rcs = {p.stem: int(p.read_text() or 1) for p in sorted(logs.glob(f"{tool}-*.rc"))}
        if not rcs:
            print(f"== {tool}: no results in {logs} (not run)")
            status = 1
            continue
        errors = warnings = 0
        flagged, missing_summary, launched, failed, cc = [], [], set(), [], None
        for shard in rcs:
            e, w, entries, seen = _reports(logs / f"{shard}.log")
            errors, warnings = errors + e, warnings + w
            flagged += entries
            if not seen:
                missing_summary.append(shard)
            cov_file = logs / f"{shard}.json"
            if cov_file.exists():
                cov = json.loads(cov_file.read_text())
                cc = tuple(cov["cc"])
                failed += cov["failed"]
                launched |= {tuple(k) for names in cov["launched"].values() for k in names}
        bad = {s: code for s, code in rcs.items() if code}
        if tool == "plain":  # the unsanitized run prints no ERROR SUMMARY
            missing_summary = []
        status |= bool(bad or errors or missing_summary)
        print(f"== {tool}: {errors} error{'' if errors == 1 else 's'}"
              + (f", {warnings} racecheck warnings" if warnings else "")
              + f"; {len(rcs)} processes"
              + (f", exit codes {bad}" if bad else ", all exited 0"))
        if missing_summary:
            print(f"   no ERROR SUMMARY in {missing_summary} (crashed or timed out: see the logs)")
        if flagged:
            print("   reports under: " + ", ".join(dict.fromkeys(flagged)))
        if failed:
            print("   entries that raised: " + ", ".join(failed))
        if cc is None:
            print("   no coverage written")
            continue
        cov = rc.coverage(launched, cc)
        print("   " + cov.summary())
        per_module = collections.Counter(module_of[k] for k in kernels)
        reached = collections.Counter(module_of[k] for k in cov.covered)
        print("   covered per module: " + ", ".join(
            f"{m} {reached[m]}/{n}" for m, n in sorted(per_module.items())))
        listing = logs / f"{tool}-covered.txt"
        listing.write_text("".join(f"{name}  {sig}\n" for name, sig in sorted(cov.covered)))
        print(f"   kernels covered: {listing}")
    return status


def main(argv) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run")
    p_run.add_argument("--shard", default="0/1")
    p_run.add_argument("--coverage")
    p_run.add_argument("--only", help="run only the entries whose name matches this regex")
    p_sum = sub.add_parser("summary")
    p_sum.add_argument("logdir")
    p_sum.add_argument("tools", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "run":
        return run(args.shard, args.coverage, args.only)
    return summary(args.logdir, args.tools)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
