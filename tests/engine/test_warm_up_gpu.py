"""After the engine's warm-up, no request compiles a kernel (docs/kernels.md, "Kernel variants"): a compile
mid-serving stalls every running request for seconds. Checked in a fresh process with an empty Triton cache, so
that nothing an earlier test compiled hides a variant the warm-up missed: every kernel the warm-up compiled lands in
the cache, and requests of every kind and shape after it must add none. Run on the device: `pytest -m gpu`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .test_engine_gpu import config_dir

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]

WORKLOAD = textwrap.dedent(
    """
    import json, os, sys
    import torch
    from lazyattn import LLM, SamplingParams

    cache = os.environ["TRITON_CACHE_DIR"]
    def compiled():
        return {os.path.join(cache, d, f) for d in os.listdir(cache) for f in os.listdir(os.path.join(cache, d))
                if f.endswith(".json") and not f.startswith("__grp__")}

    llm = LLM(model=sys.argv[1], random_weights=True, device="cuda", dtype="bfloat16", kv_cache_gb=8, mode="lazy",
              ape_prefix=True, progress=False)
    vocab = llm.engine.model_config.vocab_size
    g = torch.Generator().manual_seed(0)
    def tokens(n):
        return torch.randint(1000, vocab, (n,), generator=g).tolist()
    pool = [tokens(1024) for _ in range(16)] + [tokens(200) for _ in range(4)]
    warm = compiled()
    found = []
    def ask(label, n, docs, question, **options):
        before = compiled()
        logprobs = options.pop("logprobs", None)
        max_tokens = options.pop("max_tokens", 6)
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=logprobs)
        picks = [[pool[int(i)] for i in torch.randperm(len(pool), generator=g)[:docs]] for _ in range(n)]
        llm.generate(prompt_token_ids=[tokens(question) for _ in range(n)], document_token_ids=picks,
                     sampling_params=params, **options)
        new = compiled() - before
        if new:
            found.append([label, sorted(json.load(open(f)).get("name", f) for f in new)])
    ask("greedy, 5 new documents", 1, 5, 32)
    ask("log-probabilities", 1, 5, 32, logprobs=0)
    ask("sampled top 3", 4, 5, 32, logprobs=3)
    ask("without the shared prefix", 1, 5, 32, ape_prefix=False)
    for docs in (1, 2, 3, 8, 12):
        ask(f"{docs} documents", 4, docs, 32)
    for question in (8, 300, 1500):
        ask(f"questions of {question} tokens", 3, 5, question)
    ask("a long prompt, no documents", 2, 0, 3000)
    for n in (7, 64, 200):
        ask(f"{n} requests at once", n, 5, 32)
    ask("best-document", 16, 5, 32, answer="best-document")
    ask("each-last", 16, 5, 32, answer="each-last")
    ask("confidence order or joint, 4 tokens", 16, 5, 32, answer="confidence-order-or-joint", confidence_tokens=4)
    ask("long answers", 8, 5, 32, max_tokens=150)
    print("RESULT " + json.dumps({"warm_up": len(warm), "found": found}))
    """
)


def test_no_request_compiles_a_kernel_after_the_warm_up(tmp_path_factory, tmp_path):
    model = config_dir(tmp_path_factory, 2)
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton"), "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-c", WORKLOAD, str(model)], env=env, capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["warm_up"] > 0  # the check sees compiles at all: the warm-up's own
    assert result["found"] == [], result["found"]
