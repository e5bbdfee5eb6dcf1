"""Host time to render a RAG request whose documents recur, with the tokenizer cache off and on (CPU only).

The request: five ~2,700-token documents (the demo's five topics, each grown with seeded sentences) and a short
question, rendered with SmolLM2's tokenizer through `render_completion` and `render_chat`, as `LLM.generate`,
`LLM.chat` and the server do for every request. "off" tokenises every document every time (a tokenizer without
a cache); "on" is the engine's default cache after the first request stored the documents. The two alternate,
round by round, in one process, so that both see the same machine state.

    python -m benchmarks.document_tokens [--rounds 15] [--repeats 20] [--out FILE.json]

prints the median ms per request of each path, off and on, and their ratio; also the first request with the
cache on (it misses, then stores), and the host memory the cache holds per stored token (tracemalloc).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
import tracemalloc
from pathlib import Path

from lazyattn.demo import DOCS, QUESTIONS  # noqa: E402
from lazyattn.engine.config import EngineConfig  # noqa: E402
from lazyattn.engine.prompt import render_chat, render_completion  # noqa: E402
from lazyattn.model.hub import resolve_model  # noqa: E402
from lazyattn.model.tokenizer import load_tokenizer  # noqa: E402
from lazyattn.model.tokenizer_cache import TokenizerCache  # noqa: E402

DOC_TOKENS = 2700
NAMES = ["Oskarn", "Maren Tolle", "Lake Dorn", "Ida Pell", "the Hollow Mountains", "Brisk", "the Northern Sea"]
VERBS = ["was recorded in", "is described in", "appears in", "was revised in", "is cited by"]
THINGS = ["the harbour survey", "a council ledger", "the bakers' almanac", "an observatory log", "the river census"]


def grow(document: dict[str, str], tokenizer, rng: random.Random) -> dict[str, str]:
    """The document's text followed by seeded sentences until it has about DOC_TOKENS tokens."""
    text = document["text"]
    while len(tokenizer.encode_plain(text)) < DOC_TOKENS:
        text += "".join(
            f" {rng.choice(NAMES)} {rng.choice(VERBS)} {rng.choice(THINGS)} of {rng.randint(1700, 2024)}"
            f", page {rng.randint(1, 900)}."
            for _ in range(20)
        )
    return {"title": document["title"], "text": text}


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def per_request_ms(render, repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        render()
    return (time.perf_counter() - start) / repeats * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--repeats", type=int, default=20, help="requests rendered per round and setting")
    ap.add_argument("--out", type=Path, default=None, help="also write the results as JSON")
    args = ap.parse_args()

    path = resolve_model("smollm2")
    off, on = load_tokenizer(path), load_tokenizer(path)  # two objects of one tokenizer: only `on` has a cache
    rng = random.Random(0)
    docs = [grow(d, off, rng) for d in DOCS]
    doc_tokens = [len(off.encode_plain(d["text"])) for d in docs]
    messages = [{"role": "user", "content": QUESTIONS[0][0]}]
    paths = {
        "render_completion": lambda tok: render_completion(tok, QUESTIONS[0][0], docs),
        "render_chat": lambda tok: render_chat(tok, messages, docs),
    }

    on.cache = TokenizerCache(EngineConfig().tokenizer_cache_tokens)
    tracemalloc.start()
    first_ms = per_request_ms(lambda: paths["render_completion"](on), 1)
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    stored = on.cache.stats().tokens
    for name, render in paths.items():  # the same ids with and without the cache, before anything is timed
        assert render(on) == render(off), name

    times: dict[str, dict[str, list[float]]] = {name: {"off": [], "on": []} for name in paths}
    for _ in range(args.rounds):
        for name, render in paths.items():
            times[name]["off"].append(per_request_ms(lambda: render(off), args.repeats))  # noqa: B023
            times[name]["on"].append(per_request_ms(lambda: render(on), args.repeats))  # noqa: B023

    print(
        f"SmolLM2 tokenizer, {len(docs)} documents of {doc_tokens} tokens ({sum(doc_tokens)} in all); "
        f"{args.rounds} rounds x {args.repeats} requests per setting; {cpu_name()}"
    )
    result = {"documents": doc_tokens, "rounds": args.rounds, "repeats": args.repeats, "paths": {}}
    for name in paths:
        off_ms, on_ms = (statistics.median(times[name][k]) for k in ("off", "on"))
        result["paths"][name] = {"off_ms": off_ms, "on_ms": on_ms}
        print(f"{name:18s} off {off_ms:7.2f} ms/request   on {on_ms:6.3f} ms/request   off/on {off_ms / on_ms:6.1f}x")
    print(
        f"first request with the cache on (misses, stores): {first_ms:.2f} ms; the cache then holds {stored} tokens "
        f"in {held / 2**20:.2f} MiB of traced memory ({held / stored:.1f} bytes a token, the request's own "
        f"objects included)"
    )
    result.update(first_request_on_ms=first_ms, stored_tokens=stored, traced_bytes=held)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
