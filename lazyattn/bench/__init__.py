"""`lazyattn bench`: the RAG serving benchmark of docs/design.md, Benchmark protocol.

workload.py  the seeded trace (document pool, popularity, order, arrivals); workloads.py the named ones
replay.py    one engine per mode, identical warm-up, real-time replay of a trace
metrics.py   TTFT / TPOT / ITL / E2EL, throughput, hit ratio, prefill and KV memory of one point
hitratio.py  hit ratio vs KV budget, simulated through the engine's own cache and page pool
report.py    vLLM-style result blocks, the comparison table, JSON;  plots.py  the PNGs
steady.py    the steady-state protocol: warm-up to a steady hit ratio, a measured window; the cold-start curve
search.py    the highest rate meeting each TTFT target (growth, bisection) inside a time budget
headline.py  the steady-state run per mode, its outputs (steady.json, plots), the merge of per-mode runs
steady_report.py  steady.md: the sustainable-rate table, every point, the cold-start curve
summary.py   the markdown summary of a device run (`python -m benchmarks.serving`)
cli.py       the `lazyattn bench` command;  steady_cli.py  its steady-state options, run and --merge
"""
