"""benchmarks/lazy_block.py on the CPU at small shapes: lazy and block give the same bits in the deterministic mode
(bf16), and the report says how far apart they are without it."""

from __future__ import annotations

import json

from benchmarks import lazy_block


def test_deterministic_lazy_and_block_agree_exactly(capsys):
    args = ["--requests", "3", "--docs", "2", "--doc-len", "24", "--question", "6", "--tokens", "3"]
    assert lazy_block.main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["deterministic"] == {
        "identical_tokens": "3/3",
        "identical_logprobs": "9/9",
        "max_first_logprob_diff": 0.0,
    }
    assert report["default"]["max_first_logprob_diff"] > 0  # lazy keeps the moved keys in fp32 there
