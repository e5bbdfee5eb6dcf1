"""Where lazy mode places its documents, measured on answers: documents at their sequential logical positions (as
served), all at the same positions (Adaptive Parallel Encoding's layout), or overlapping in between.

With the shared prefix (docs/design.md, "APE") every document is encoded after the first segment S_0, at L_0 + j.
Served, document i is then read at its sequential start s_i = L_0 + (L_1 + … + L_{i−1}). Here document i is read
at L_0 + floor(spread · (L_1 + … + L_{i−1})) instead, and the final segment starts after the furthest document end:
spread 1 is what lazy mode serves, spread 0 puts every document at L_0 (APE's parallel layout, the final segment at
L_0 + max L_i), values between overlap the documents. `scale=S` adds ln S to the final rows' scores of document
keys (APE's scale). Several spreads (`spread=1+0`) read every document once per placement in the same row, one
copy each, the final segment after the furthest end of any; `:end` moves each placement later until its furthest
end is the final segment's start (`spread=1+0:end`: every document also read as if it came last).

It runs on transformers (the engine's rows have contiguous positions by construction), with the training rows'
construction (lazyattn/finetune/masks.py): a document read somewhere other than L_0 gets its own copy of S_0 just
before it, so that it is encoded exactly as lazy mode encodes it; spread 1 is `masks.row(..., ape_prefix=True)`.
Greedy answers, up to 32 tokens, the eval's containment accuracy, the eval's default chat layout:

    python -m benchmarks.quality_positions run OUT.json --models smollm2-block,smollm2 \
        --sets real-heldout,real-heldout-readme --modes full,spread=1,spread=0,spread=0:scale=0.5 --num-docs 5 \
        [--positions first,middle,last]
    python -m benchmarks.quality_positions summary OUT.json [MORE.json ...]

`summary` prints, per model and set, each mode's accuracy per gold position and on the mean, and its difference from
full attention with the paired 95 % bootstrap interval over the same questions; `--surer A,B` adds the mode that
keeps, per question, the answer of A or B with the higher mean token log-probability (as `answer="each-last"` keeps
the surest of its candidates).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from lazyattn.finetune.masks import additive
from lazyattn.finetune.masks import row as training_row

POSITIONS = ("first", "middle", "last")
MAX_TOKENS = 32
BATCH = 32


def parse_mode(mode: str) -> tuple[tuple[float, ...], float, bool] | None:
    """ "full" -> None; "spread=X[+Y…][:scale=S][:end]" -> ((X, Y, …), S, end)."""
    if mode == "full":
        return None
    fields = dict(part.partition("=")[::2] for part in mode.split(":"))
    try:
        if set(fields) - {"spread", "scale", "end"} or "spread" not in fields or fields.get("end", "") != "":
            raise ValueError
        spreads = tuple(float(x) for x in fields["spread"].split("+"))
        scale = float(fields.get("scale", 1.0))
    except ValueError:
        raise ValueError(f"mode must be full or spread=X[+Y...][:scale=S][:end], got {mode!r}") from None
    if not (all(0.0 <= x <= 1.0 for x in spreads) and scale > 0) or len(set(spreads)) != len(spreads):
        raise ValueError(f"spreads must be distinct, in [0, 1], and scale > 0, got {mode!r}")
    return spreads, scale, "end" in fields


def placed_row(
    segments: Sequence[Sequence[int]],
    tail: Sequence[int],
    spread: float | Sequence[float],
    scale: float = 1.0,
    end: bool = False,
) -> tuple[list[int], list[int], torch.Tensor]:
    """Tokens, positions and the additive [T, T] mask of a block row with the shared prefix whose documents are
    read at L_0 + floor(spread · earlier lengths), once per spread given (several: every document read at each
    placement in one row, one copy per placement): each copy sees S_0 (or its own copy of S_0 just before it) and
    itself causally; the tail, after the furthest document end, sees S_0, every copy and itself, ln(scale) added
    to its scores of every copy's keys. `end`: each placement moved later so that its furthest end is the tail's
    start (a placement that ends there already stays)."""
    spreads = [spread] if isinstance(spread, (int, float)) else list(spread)
    lens = [len(s) for s in segments]
    l0 = lens[0]
    placements = []  # per spread, each document's start
    for x in spreads:
        before, starts = 0, []
        for n in lens[1:]:
            starts.append(l0 + math.floor(x * before))
            before += n
        placements.append(starts)
    ends = [max([l0, *(a + n for a, n in zip(starts, lens[1:]))]) for starts in placements]
    top = max(ends)
    if end:
        placements = [[a + top - e for a in starts] for starts, e in zip(placements, ends)]
    first = list(segments[0])
    tokens, positions = list(first), list(range(l0))
    spans: list[tuple[int, int, int]] = []  # (where its S_0 sits, document start, document end) in the row
    for starts in placements:
        for seg, start in zip(segments[1:], starts):
            prefix = 0
            if start != l0:
                prefix = len(tokens)
                tokens += first
                positions += range(start - l0, start)
            spans.append((prefix, len(tokens), len(tokens) + len(seg)))
            tokens += seg
            positions += range(start, start + len(seg))
    context = len(tokens)
    tokens += tail
    positions += range(top, top + len(tail))
    seen = torch.zeros(len(tokens), len(tokens), dtype=torch.bool)
    seen[:l0, :l0] = True
    for prefix, lo, hi in spans:
        seen[prefix : prefix + l0, prefix : prefix + l0] = True
        seen[lo:hi, prefix : prefix + l0] = True
        seen[lo:hi, lo:hi] = True
        seen[context:, lo:hi] = True
    seen[context:, :l0] = True
    seen[context:, context:] = True
    mask = additive(seen & torch.ones_like(seen).tril())
    if scale != 1.0:
        for _, lo, hi in spans:
            mask[context:, lo:hi] += math.log(scale)
    return tokens, positions, mask


def mode_row(segments: Sequence[Sequence[int]], tail: Sequence[int], mode: str) -> tuple[list[int], list[int], Any]:
    placement = parse_mode(mode)
    if placement is None:
        r = training_row(segments, tail, block=False)
        return r.tokens, r.positions, additive(r.visible)
    return placed_row(segments, tail, *placement)


@torch.no_grad()
def greedy(
    model: torch.nn.Module,
    rows: Sequence[tuple[list[int], list[int], torch.Tensor]],
    max_new: int,
    eos: set[int],
    device: torch.device,
    dtype: torch.dtype,
) -> list[tuple[list[int], float]]:
    """Greedy continuations of rows (tokens, positions, additive mask), left-padded into one batch with a KV cache:
    each new token sees every row token and the tokens generated before it, at the positions after the row's
    last; a continuation ends after its first end-of-sequence token or `max_new` tokens. With each, the mean
    log-probability of its tokens (the engine's confidence, engine/best_document.py)."""
    b, width = len(rows), max(len(r[0]) for r in rows)
    low = torch.finfo(torch.float32).min
    ids = torch.zeros(b, width, dtype=torch.long)
    pos = torch.zeros(b, width, dtype=torch.long)
    mask = torch.full((b, 1, width, width), low)
    keys = torch.zeros(b, width)
    for i, (tokens, positions, m) in enumerate(rows):
        pad = width - len(tokens)
        ids[i, pad:], pos[i, pad:] = torch.tensor(tokens), torch.tensor(positions)
        mask[i, 0, pad:, pad:] = m
        mask[i, 0, range(pad), range(pad)] = 0.0  # a padding row sees itself, so its (unused) output is finite
        keys[i, :pad] = low
    out = model(
        input_ids=ids.to(device), position_ids=pos.to(device), attention_mask=mask.to(device, dtype), use_cache=True
    )
    cache, last = out.past_key_values, pos[:, -1]
    answers: list[list[int]] = [[] for _ in range(b)]
    logprobs: list[list[float]] = [[] for _ in range(b)]
    open_rows = set(range(b))
    for step in range(max_new):
        scores = out.logits[:, -1].float().log_softmax(-1).cpu()
        nxt = scores.argmax(-1)
        for i in list(open_rows):
            answers[i].append(int(nxt[i]))
            logprobs[i].append(float(scores[i, nxt[i]]))
            if int(nxt[i]) in eos:
                open_rows.discard(i)
        if not open_rows or step == max_new - 1:
            break
        last = last + 1
        keys = torch.cat([keys, torch.zeros(b, 1)], 1)
        out = model(
            input_ids=nxt[:, None].to(device),
            position_ids=last[:, None].to(device),
            attention_mask=keys[:, None, None, :].to(device, dtype),
            past_key_values=cache,
            use_cache=True,
        )
        cache = out.past_key_values
    return [(a, sum(lp) / len(lp)) for a, lp in zip(answers, logprobs)]


def load(name: str, device: torch.device, dtype: torch.dtype) -> tuple[torch.nn.Module, Any]:
    """The transformers model of anything the engine loads, with the engine's own weights (an adapter folded in as
    the engine serves it) in its base's architecture."""
    from lazyattn.finetune.base import engine_weights, load_base
    from lazyattn.model.adapter import is_adapter_dir, read_adapter
    from lazyattn.model.hub import resolve_model

    path = resolve_model(name)
    base = load_base(read_adapter(path).base if is_adapter_dir(path) else name)
    weights = engine_weights(name)
    if base.model.config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    base.model.load_state_dict(weights, strict=False)
    if base.model.config.tie_word_embeddings:
        base.model.tie_weights()
    return base.model.to(device, dtype).eval(), base.tokenizer


def run(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    from lazyattn.engine.prompt import DEFAULT_LAYOUT, render_chat
    from lazyattn.eval import real
    from lazyattn.eval.metrics import Scores
    from lazyattn.qa.dataset import arrange

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    modes = args.modes.split(",")
    for mode in modes:
        parse_mode(mode)
    results: dict[str, dict[str, Any]] = {}
    for name in args.models.split(","):
        model, tok = load(name, device, dtype)
        eos = set(tok.eos_token_ids)
        for dataset in args.sets.split(","):
            _, items = real.load(dataset, args.limit)
            for docs, position in [(d, p) for d in args.num_docs for p in args.positions]:
                shown = [arrange(item, docs, position) for item in items]
                prompts = [
                    render_chat(tok, [{"role": "user", "content": it.question}], list(it.documents), DEFAULT_LAYOUT)
                    for it in shown
                ]
                for mode in modes:
                    rows = [mode_row(p.segments, p.final, mode) for p in prompts]
                    texts, sureness = [], []
                    for lo in range(0, len(rows), BATCH):
                        for answer, mean in greedy(model, rows[lo : lo + BATCH], MAX_TOKENS, eos, device, dtype):
                            texts.append(tok.decode([t for t in answer if t not in eos]).strip())
                            sureness.append(mean)
                    key = f"{name}|{dataset}|{docs}|{position}|{mode}"
                    results[key] = {
                        "ids": [it.id for it in shown],
                        "accuracy": [Scores.of(t, it.answers).accuracy for t, it in zip(texts, shown)],
                        "outputs": texts,
                        "confidence": sureness,
                    }
                    mean = 100 * sum(results[key]["accuracy"]) / len(texts)
                    print(f"{key}: {mean:.1f} % of {len(texts)}", flush=True)
    return results


def with_surer(results: dict[str, dict[str, Any]], modes: Sequence[str]) -> dict[str, dict[str, Any]]:
    """`results` and, for every model, set and gold position that answered in all of `modes`, the mode
    "surer:A,B,…": each question's answer from the mode whose answer has the highest mean log-probability (on a tie
    the earlier mode), as the engine's choosing strategies keep the surest of their candidates."""
    name = "surer:" + ",".join(modes)
    out = dict(results)
    for key in results:
        model, dataset, docs, position, mode = key.split("|")
        cell = f"{model}|{dataset}|{docs}|{position}"
        if mode != modes[0] or not all(f"{cell}|{m}" in results for m in modes):
            continue
        runs = [results[f"{cell}|{m}"] for m in modes]
        picked = [
            max(range(len(runs)), key=lambda r: (runs[r]["confidence"][q], -r)) for q in range(len(runs[0]["ids"]))
        ]
        out[f"{cell}|{name}"] = {
            "ids": runs[0]["ids"],
            "accuracy": [runs[r]["accuracy"][q] for q, r in enumerate(picked)],
            "outputs": [runs[r]["outputs"][q] for q, r in enumerate(picked)],
            "confidence": [runs[r]["confidence"][q] for q, r in enumerate(picked)],
        }
    return out


def summary(results: dict[str, dict[str, Any]]) -> str:
    from benchmarks.finetune_prefix_summary import diff

    def scores(group: str, mode: str, positions: Sequence[str]) -> dict[str, float]:
        per = [results[f"{group}|{p}|{mode}"] for p in positions]
        return {q: sum(dict(zip(r["ids"], r["accuracy"]))[q] for r in per) / len(per) for q in per[0]["ids"]}

    groups: dict[str, list[str]] = {}  # "model|set|documents": its modes in order
    for key in results:
        model, dataset, docs, _, mode = key.split("|")
        modes = groups.setdefault(f"{model}|{dataset}|{docs}", [])
        if mode not in modes:
            modes.append(mode)
    lines = []
    for group, modes in groups.items():
        model, dataset, docs = group.split("|")
        n = len(results[f"{group}|first|{modes[0]}"]["ids"])
        lines += [
            f"### `{model}`, `builtin:{dataset}`, {docs} documents ({n} questions)",
            "",
            "| mode | first | middle | last | mean | mean − full | first − full | middle − full | last − full |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for mode in modes:
            cells = [100 * sum(s.values()) / len(s) for p in POSITIONS for s in [scores(group, mode, [p])]]
            versus = ["-"] * 4
            if mode != "full" and "full" in modes:
                versus = [
                    diff(scores(group, "full", ps), scores(group, mode, ps))
                    for ps in (POSITIONS, *[[p] for p in POSITIONS])
                ]
            row = [f"{c:.1f}" for c in cells] + [f"{sum(cells) / 3:.1f}"] + versus
            lines.append(f"| {mode} | " + " | ".join(row) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quality_positions", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="answer every question in every mode; write per-question accuracies")
    r.add_argument("out", type=Path)
    r.add_argument("--models", default="smollm2-block,smollm2")
    r.add_argument("--sets", default="real-heldout,real-heldout-readme")
    r.add_argument("--modes", default="full,spread=1,spread=0")
    r.add_argument("--num-docs", type=lambda v: [int(n) for n in v.split(",")], default=[5], help="N[,M...]")
    r.add_argument("--limit", type=int, default=None)
    r.add_argument(
        "--positions", type=lambda v: v.split(","), default=list(POSITIONS), help="gold positions (first,middle,last)"
    )
    r.add_argument("--device", default=None)
    s = sub.add_parser("summary", help="tables of one or more run outputs")
    s.add_argument("files", type=Path, nargs="+")
    s.add_argument(
        "--surer", default=None, help="modes A,B,...: add the mode that keeps each question's surest of their answers"
    )
    args = parser.parse_args(argv)
    if args.command == "run":
        args.out.write_text(json.dumps(run(args)))
        print(f"wrote {args.out}")
    else:
        merged: dict[str, dict[str, Any]] = {}
        for f in args.files:
            merged |= json.loads(f.read_text())
        if args.surer:
            merged = with_surer(merged, args.surer.split(","))
        sys.stdout.write(summary(merged))


if __name__ == "__main__":
    main()
