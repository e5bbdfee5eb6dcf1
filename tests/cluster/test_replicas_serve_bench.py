"""benchmarks/replicas_serve.py end to end on the CPU (tiny model, a local Ray instance started by
`lazyattn serve --replicas`): every configuration answers every request, and the files are written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_run_serves_every_request(tmp_path):
    command = [sys.executable, "-m", "benchmarks.replicas_serve", "--quick", "--replicas", "1,2", "--no-reference"]
    command += ["--budget-s", "400", "--point-s", "90", "--out", str(tmp_path)]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / "replicas_serve.json").read_text())
    results = data["results"]
    assert list(results) == ["1 replica", "2 replicas"]
    per_replica = data["meta"]["workload"]["num_requests"]
    for n, r in zip((1, 2), results.values()):
        assert (r["requests"], r["completed"], r["errors"]) == (n * per_replica, n * per_replica, 0), r
        # Zipf 2.1 over 20 documents, 5 a request: the trace repeats documents, so some prompt tokens are cached,
        # and the question and the first time of each document are not
        assert 0 < r["hit_ratio"] < 1
    table = (tmp_path / "replicas_serve.md").read_text()
    assert "| 2 replicas | 16/16 |" in table
