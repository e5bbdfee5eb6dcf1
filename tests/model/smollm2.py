"""SmolLM2-135M-Instruct for tests: the real RAG requests sent to it (the file itself is the `smollm2_gguf`
fixture of conftest.py). Tests only."""

from __future__ import annotations

from lazyattn.demo import DOCS, QUESTIONS

GEN = 6
VELTRIA, HARP, RIVER = DOCS[0], DOCS[1], DOCS[2]
# The second request places two of the first one's documents in new slots (lazy mode reuses them shifted).
REQUESTS = [
    ([{"role": "user", "content": QUESTIONS[0][0]}], [HARP, VELTRIA, RIVER]),
    ([{"role": "user", "content": QUESTIONS[1][0]}], [RIVER, HARP]),
]
