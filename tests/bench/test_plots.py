"""matplotlib is an extra (`plots`): without it every plot is skipped with a one-line note and nothing else fails."""

from __future__ import annotations

import sys

from lazyattn.bench import plots
from lazyattn.eval import report

REPLICA_ROWS = [
    {
        "variant": "paper",
        "policy": "round-robin",
        "replicas": n,
        "doc_hit_ratio": 0.5,
        "busy_imbalance": 1.1,
        "single_engine_hit_ratio": 0.6,
    }
    for n in (1, 2)
]


def test_without_matplotlib_a_plot_is_skipped_with_a_note(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    path = tmp_path / "replicas.png"
    assert plots.plot_replicas(REPLICA_ROWS, path) is False
    assert report.plot_accuracy([], tmp_path / "accuracy.png") is False
    assert not list(tmp_path.iterdir())
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"skipped {path}: {plots.PLOTS_EXTRA_NOTE}",
        f"skipped {tmp_path / 'accuracy.png'}: {plots.PLOTS_EXTRA_NOTE}",
    ]
    assert "lazyattn[plots]" in plots.PLOTS_EXTRA_NOTE


def test_with_matplotlib_the_plot_is_written(tmp_path):
    path = tmp_path / "replicas.png"
    assert plots.plot_replicas(REPLICA_ROWS, path) is True
    assert path.stat().st_size > 0
