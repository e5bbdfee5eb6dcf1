"""PNG plots of benchmark results (matplotlib, no display needed).

matplotlib is an extra (`pip install "lazyattn[plots]"`; `[test]` includes it): without it each plot is skipped
with a one-line note and its function returns False, so a run still writes its JSON and tables. Every plot
function returns True when it wrote its file.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from lazyattn.bench.report import PointResult

MODE_STYLE = {
    "lazy": ("tab:blue", "o"),
    "block": ("tab:orange", "s"),
    "prefix": ("tab:green", "^"),
    "full": ("tab:red", "v"),
}


PLOTS_EXTRA_NOTE = 'matplotlib is not installed (pip install "lazyattn[plots]")'


def pyplot(path: str | Path):
    """matplotlib.pyplot on the Agg backend, or None with a one-line note that `path` is skipped."""
    try:
        import matplotlib
    except ImportError:
        print(f"skipped {path}: {PLOTS_EXTRA_NOTE}", flush=True)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _legend(ax, **kw) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kw)


def plot_rate_sweep(results: Sequence[PointResult], path: str | Path, title: str = "") -> bool:
    """TTFT (mean, p99 dashed) and output-token throughput against request rate, one column per group;
    saturation is the rightmost tick. False if there is nothing to plot (no Poisson or saturation point)."""
    points = [r for r in results if r.summary is not None and r.concurrency is None]
    groups = list(dict.fromkeys(r.group for r in points))
    rates = sorted({r.rate for r in points if r.rate is not None})
    if not points or len(rates) + any(r.rate is None for r in points) < 2:
        return False
    ticks = rates + [math.inf]
    x_of = {rate: i for i, rate in enumerate(ticks)}
    plt = pyplot(path)
    if plt is None:
        return False
    fig, axes = plt.subplots(2, len(groups), figsize=(5.2 * len(groups), 7.5), squeeze=False)
    for col, group in enumerate(groups):
        for mode in dict.fromkeys(r.mode for r in points if r.group == group):
            rows = sorted(
                (r for r in points if r.group == group and r.mode == mode),
                key=lambda r: x_of[r.rate if r.rate is not None else math.inf],
            )
            xs = [x_of[r.rate if r.rate is not None else math.inf] for r in rows]
            color, marker = MODE_STYLE.get(mode, ("black", "x"))
            axes[0][col].plot(xs, [r.summary.ttft.mean for r in rows], color=color, marker=marker, label=mode)
            axes[0][col].plot(xs, [r.summary.ttft.p99 for r in rows], color=color, ls="--", alpha=0.5)
            axes[1][col].plot(xs, [r.summary.output_throughput for r in rows], color=color, marker=marker, label=mode)
        for row, ylabel in ((0, "TTFT (ms): mean, p99 dashed"), (1, "output tokens / s")):
            ax = axes[row][col]
            ax.set_xticks(range(len(ticks)), [f"{t:g}" for t in rates] + ["sat."])
            ax.set_xlabel("request rate (req/s)")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
        axes[0][col].set_yscale("log")
        axes[0][col].set_title(group)
        _legend(axes[0][col])
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_hit_ratio(
    sim_rows: Sequence[dict], path: str | Path, engine_rows: Sequence[dict] = (), title: str = ""
) -> bool:
    """Document hit ratio against KV budget: one panel per budget policy, color by skew, line style by mode;
    engine runs as large hollow markers. Rows: {policy, alpha, mode, budget_gb, doc_hit_ratio}."""
    policies = list(dict.fromkeys(r["policy"] for r in sim_rows))
    alphas = sorted({r["alpha"] for r in sim_rows}, key=lambda a: (a is None, a or 0.0))
    colors = dict(zip(alphas, ["tab:purple", "tab:cyan", "tab:olive", "tab:brown", "tab:pink", "tab:gray"]))
    dashes = {"lazy": "-", "block": "--", "prefix": ":"}
    plt = pyplot(path)
    if plt is None:
        return False
    fig, axes = plt.subplots(1, len(policies), figsize=(6 * len(policies), 4.6), squeeze=False)
    for ax, policy in zip(axes[0], policies):
        for alpha in alphas:
            for mode in dashes:
                rows = sorted(
                    (r for r in sim_rows if r["policy"] == policy and r["alpha"] == alpha and r["mode"] == mode),
                    key=lambda r: r["budget_gb"],
                )
                rows = [r for r in rows if r["doc_hit_ratio"] is not None]
                if rows:
                    label = f"{mode}, " + ("uniform" if alpha is None else f"α {alpha:g}")
                    ax.plot(
                        [r["budget_gb"] for r in rows],
                        [100 * r["doc_hit_ratio"] for r in rows],
                        color=colors[alpha],
                        ls=dashes[mode],
                        marker=MODE_STYLE[mode][1],
                        ms=4,
                        label=label,
                    )
        for r in engine_rows:
            if r["policy"] == policy:
                ax.scatter(
                    [r["budget_gb"]],
                    [100 * r["doc_hit_ratio"]],
                    s=140,
                    facecolors="none",
                    edgecolors=MODE_STYLE[r["mode"]][0],
                    linewidths=2,
                    zorder=5,
                    label=f"engine run: {r['mode']}",
                )
        ax.set_xscale("log")
        ax.set_xlabel("KV budget (GB)")
        ax.set_ylabel("document hit ratio (%)")
        ax.set_title(
            {"pool": "KV pool = budget", "pool_plus_request": "KV pool = budget + one block request"}.get(
                policy, policy
            ),
            fontsize=10,
        )
        ax.grid(alpha=0.3)
        _legend(ax, fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_shared_document(results: Sequence[PointResult], path: str | Path, title: str = "") -> bool:
    """Peak KV memory and output-token throughput against concurrency, per mode."""
    points = [r for r in results if r.summary is not None and r.concurrency is not None]
    plt = pyplot(path)
    if plt is None:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    for mode in dict.fromkeys(r.mode for r in points):
        rows = sorted((r for r in points if r.mode == mode), key=lambda r: r.concurrency)
        color, marker = MODE_STYLE.get(mode, ("black", "x"))
        xs = [r.concurrency for r in rows]
        axes[0].plot(xs, [r.summary.peak_kv_gb for r in rows], color=color, marker=marker, label=mode)
        axes[1].plot(xs, [r.summary.output_throughput for r in rows], color=color, marker=marker, label=mode)
    for ax, ylabel in zip(axes, ("peak KV memory (GiB)", "output tokens / s")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests sharing the document")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        _legend(ax)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_host_tier(rows: Sequence[dict], path: str | Path, title: str = "") -> bool:
    """`python -m benchmarks.host_tier` rows: effective hit ratio (left) and mean TTFT (right, p99 dashed) against
    the GPU KV budget, one color per workload, hollow markers GPU-only, filled with the host tier."""
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    colors = dict(zip(workloads, ["tab:blue", "tab:orange", "tab:green", "tab:purple"]))
    plt = pyplot(path)
    if plt is None:
        return False
    fig, (hit_ax, ttft_ax) = plt.subplots(1, 2, figsize=(11, 4.4))
    for workload in workloads:
        for tiered in (False, True):
            sel = sorted(
                (r for r in rows if r["workload"] == workload and bool(r["host_gb"]) == tiered),
                key=lambda r: r["budget_gb"],
            )
            if not sel:
                continue
            label = f"{workload}, " + (f"host tier {sel[0]['host_gb']:g} GiB" if tiered else "GPU only")
            style = dict(
                color=colors[workload],
                marker="o",
                mfc=colors[workload] if tiered else "none",
                ls="-" if tiered else ":",
            )
            budgets = [r["budget_gb"] for r in sel]
            hit_ax.plot(budgets, [r["eff_hit"] for r in sel], label=label, **style)
            ttft_ax.plot(budgets, [r["ttft_mean_ms"] for r in sel], label=label, **style)
            ttft_ax.plot(
                budgets, [r["ttft_p99_ms"] for r in sel], color=colors[workload], alpha=0.4, ls="--", marker=""
            )
    for ax, ylabel in ((hit_ax, "effective document hit ratio (%)"), (ttft_ax, "TTFT mean, p99 faint dashed (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPU KV budget (GiB)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        _legend(ax, fontsize=7)
    ttft_ax.set_yscale("log")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


ROUTER_STYLE = {
    "round-robin": ("tab:gray", "o"),
    "least-loaded": ("tab:orange", "s"),
    "prefix-affinity": ("tab:green", "^"),
    "document-affinity": ("tab:blue", "D"),
}


def plot_replicas(rows: Sequence[dict], path: str | Path, title: str = "") -> bool:
    """Per workload variant (columns): cluster document hit ratio against replicas, one line per router, with
    one engine holding the cluster's total KV dashed; below, load imbalance (busiest replica's busy time over
    the mean). Rows: bench/replicas.py's."""
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    plt = pyplot(path)
    if plt is None:
        return False
    fig, axes = plt.subplots(2, len(variants), figsize=(4.6 * len(variants), 7.2), squeeze=False)
    for col, variant in enumerate(variants):
        mine = [r for r in rows if r["variant"] == variant]
        for policy in dict.fromkeys(r["policy"] for r in mine):
            pts = sorted((r for r in mine if r["policy"] == policy), key=lambda r: r["replicas"])
            color, marker = ROUTER_STYLE.get(policy, ("black", "x"))
            xs = [r["replicas"] for r in pts]
            axes[0][col].plot(
                xs, [100 * r["doc_hit_ratio"] for r in pts], color=color, marker=marker, ms=4, label=policy
            )
            axes[1][col].plot(xs, [r["busy_imbalance"] for r in pts], color=color, marker=marker, ms=4, label=policy)
        single = sorted({(r["replicas"], r["single_engine_hit_ratio"]) for r in mine})
        axes[0][col].plot(
            [n for n, _ in single],
            [100 * h for _, h in single],
            color="black",
            ls="--",
            lw=1,
            label="one engine, same total KV",
        )
        axes[0][col].set_title(variant)
        for row, ylabel in ((0, "cluster document hit ratio (%)"), (1, "busy time: max / mean replica")):
            ax = axes[row][col]
            ax.set_xscale("log", base=2)
            ax.set_xlabel("replicas")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
        _legend(axes[0][col], fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_steady(data: dict, path: str | Path, targets_ms: Sequence[float] = ()) -> bool:
    """Steady-state TTFT (p50 solid, p99 dashed) against offered rate, one line pair per mode (a rate measured twice:
    its latest point), the TTFT targets as grey lines; an unanswered share over 1 % puts p99 at the top edge. False
    if no mode has two points."""
    from lazyattn.bench.steady import PointResult

    series = {}
    for mode, entry in data["modes"].items():
        latest = {d["rate"]: d for d in entry.get("points", [])}  # a rate the search measured again: its latest
        pts = sorted((PointResult.from_dict(d) for d in latest.values()), key=lambda p: p.rate)
        pts = [p for p in pts if p.window_requests]
        if pts:
            series[mode] = pts
    if not any(len(p) >= 2 for p in series.values()):
        return False
    finite = [v for pts in series.values() for p in pts for v in p.ttft_ms.values() if math.isfinite(v) and v > 0]
    top = max(finite + list(targets_ms) + [1.0]) * 3
    plt = pyplot(path)
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for mode, pts in series.items():
        color, marker = MODE_STYLE.get(mode, ("black", "x"))
        rates = [p.rate for p in pts]
        clip = lambda v: v if math.isfinite(v) else top  # noqa: E731
        ax.plot(rates, [clip(p.ttft_ms["p50"]) for p in pts], color=color, marker=marker, label=f"{mode} p50")
        ax.plot(rates, [clip(p.ttft_ms["p99"]) for p in pts], color=color, marker=marker, ls="--", mfc="none")
    ax.set_xscale("log")
    ax.set_yscale("log")
    for t in targets_ms:
        ax.axhline(t, color="grey", lw=0.8, ls=":")
        ax.text(0.01, t, f"p99 target {t:g} ms", transform=ax.get_yaxis_transform(), fontsize=7, color="grey")
    ax.xaxis.set_major_formatter(plt.matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_formatter(plt.matplotlib.ticker.FuncFormatter(_two_and_five))
    ax.set_ylim(top=top * 1.05)
    ax.set_xlabel("offered request rate (req/s, Poisson)")
    ax.set_ylabel("TTFT in the steady window (ms): p50, p99 dashed")
    ax.grid(alpha=0.3, which="both")
    _legend(ax, fontsize=8)
    w = data["workload"]
    ax.set_title(f"{w['name']}: {data.get('meta', {}).get('model', '')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_cold_start(data: dict, path: str | Path) -> bool:
    """The cold-start curve: TTFT p50 / p99 (left) and document hit ratio (right) per time bin, per mode."""
    curves = {m: e["cold_start"]["bins"] for m, e in data["modes"].items() if e.get("cold_start")}
    if not curves:
        return False
    plt = pyplot(path)
    if plt is None:
        return False
    fig, (ttft_ax, hit_ax) = plt.subplots(1, 2, figsize=(11, 4.4))
    for mode, bins in curves.items():
        color, marker = MODE_STYLE.get(mode, ("black", "x"))
        ts = [b["t_s"] for b in bins]
        ttft_ax.plot(ts, [b["ttft_p50_ms"] for b in bins], color=color, marker=marker, label=f"{mode} p50")
        ttft_ax.plot(ts, [b["ttft_p99_ms"] for b in bins], color=color, ls="--", alpha=0.6)
        hit_ax.plot(ts, [100 * (b["hit_ratio"] or 0) for b in bins], color=color, marker=marker, label=mode)
    ttft_ax.set_yscale("log")
    ttft_ax.set_ylabel("TTFT (ms): p50, p99 dashed")
    hit_ax.set_ylabel("document hit ratio (%)")
    for ax in (ttft_ax, hit_ax):
        ax.set_xlabel("seconds since the first request (empty cache)")
        ax.grid(alpha=0.3)
        _legend(ax, fontsize=8)
    fig.suptitle(f"{data['workload']['name']}: cold start", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _two_and_five(x: float, _pos: int) -> str:
    """A log axis's minor tick label only at 2 and 5 times a power of ten: every minor label collides."""
    if x <= 0:
        return ""
    mantissa = round(x / 10 ** math.floor(math.log10(x)), 6)
    return f"{x:g}" if mantissa in (2.0, 5.0) else ""
