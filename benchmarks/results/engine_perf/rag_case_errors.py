"""The errors behind test_gpu_rag_case[1]'s bounds (tests/kernels/test_prefill.py), printed: default launch (Q copies
rotated up front) vs the reference, the dense ground truth, Q rotated in the kernel, and the copies from the RoPE
launch (cache_ops.rope_write_kv_runs). Run on a GPU from the repository root."""

import torch

from tests.kernels.test_prefill import gpu_scenario, ref, rel_err, run
from tests.kernels.test_rotated_runs import fold

s = gpu_scenario([2048] * 5, [([0, 1, 2, 3, 4], 32)])
q, batch = s.final_prefill()
out = run(s, q, batch)
rows = {
    "vs reference": rel_err(out, ref(s, q, batch)),
    "vs dense": rel_err(out, torch.cat([s.dense_final(r) for r in s.requests])),
    "vs rotated_runs=0": rel_err(run(s, q, batch, rotated_runs=0), out),
    "vs num_splits=1": rel_err(run(s, q, batch, num_splits=1), out),
}
_, _, batch_f, q_f, q_rot = fold(s, 8)
rows["RoPE-launch q vs scenario q"] = rel_err(q_f, q)
default = run(s, q_f, batch_f)
rows["attention over RoPE-launch copies vs default"] = rel_err(run(s, q_f, batch_f, rotated_q=q_rot), default)
for name, err in rows.items():
    print(f"{name}: {err:.3e}")
