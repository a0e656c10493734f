"""Determinism (issue 20): every entry of the reliability table (tests/reliability_calls.py)
gives bit-identical outputs when repeated in one process, and the same bits in other
processes from the same seeds.

No entry is exempt, because no kernel sums floats in an order that changes run to run.
The atomics in the package, and why each leaves the bits fixed:

- kernels/helpers/epilogue.py:185, ``cuda.atomic.add`` on a uint32 arrival counter
  (split-K in matmul, matmul_int8, qkv_project_int8, the int4 kernels): it only decides
  which block of a tile folds the partials, and that block adds them in split order;
- kernels/quantize.py:108 and :148, ``cuda.atomic.max`` on float bits (the absmax of
  quantize_int8's two-launch paths): a maximum does not depend on the order.

attention_bwd has none (kernels/helpers/attention_bwd.py: dK/dV summed over the GQA group
on chip, dQ in a pass of its own), nor have the norms' weight gradients (kernels/norms.py:
partials in a workspace, summed by a column reduction). What is unspecified by design is
kept out of the table: ``x[idx] = v`` with repeated indices (which value lands), so the
scatter entries use distinct indices.

The two-process test comes first: its processes (the table in shards, side by side) also
fill the on-disk kernel cache, so the repeats then load cubins instead of compiling about
460 kernels one at a time.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import reliability_calls as rc
from kaionb._device import compute_capability

gpu = pytest.mark.gpu
REPEATS = 20
TABLE = rc.calls()
SHARDS = max(1, min(8, (os.cpu_count() or 2) // 2))


def _hashes(tmp_path, tag, shards) -> dict:
    """{entry: sha256} from ``reliability_calls.py --hashes``, in ``shards`` processes."""
    script = Path(rc.__file__)
    root = script.parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    files = [tmp_path / f"{tag}-{i}.json" for i in range(shards)]
    procs = [subprocess.Popen([sys.executable, str(script), "--hashes", str(f),
                               "--shard", f"{i}/{shards}"], cwd=root, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i, f in enumerate(files)]
    for proc in procs:
        out, _ = proc.communicate(timeout=1200)
        assert proc.returncode == 0, out[-4000:]
    hashes = {}
    for f in files:
        hashes.update(json.loads(f.read_text()))
    return hashes


@gpu
def test_processes_agree(tmp_path):
    """Every entry hashed in two rounds of processes: the same sha256 each time. The
    rounds split the table differently, so an entry runs after other entries (and the
    workspaces, plans and recorded calls they leave) in each."""
    first = _hashes(tmp_path, "first", SHARDS)
    second = _hashes(tmp_path, "second", SHARDS + 1)
    assert set(first) == set(second) == {c.name for c in TABLE if c.runs_on(compute_capability())}
    differ = sorted(name for name in first if first[name] != second[name])
    assert not differ, f"outputs differ between processes: {differ}"


@gpu
@pytest.mark.parametrize("entry", TABLE, ids=[c.name for c in TABLE])
def test_repeats_are_bit_identical(entry):
    if not entry.runs_on(compute_capability()):
        pytest.skip(f"{entry.name} does not run on compute capability {compute_capability()}")
    fn = entry.make(np.random.default_rng(rc.seed(entry.name)))
    first = [rc.digest(a) for a in rc.arrays(fn())]
    for repeat in range(1, REPEATS):
        again = [rc.digest(a) for a in rc.arrays(fn())]
        differ = [i for i, (a, b) in enumerate(zip(first, again)) if a != b]
        assert not differ, f"{entry.name}: repeat {repeat} changed output(s) {differ}"
