"""`lazyattn eval --fidelity` (lazyattn/eval/fidelity.py holds the comparisons): the plan of engines from the
command line, the run, and fidelity.{json,md} written after every pass."""

from __future__ import annotations

import argparse
import platform
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

from lazyattn.engine.config import DTYPES, MODES
from lazyattn.eval.inputs import describe_dataset, load_questions, parse_names, prompt_layout


def cmd_fidelity(args: argparse.Namespace, engine_options: Callable[[argparse.Namespace], dict]) -> int:
    """`lazyattn eval --fidelity` (lazyattn/eval/fidelity.py): every mode and dtype, the float32 references, the
    batch sizes; one comparison per row."""
    from lazyattn.bench.report import write_json
    from lazyattn.eval import fidelity
    from lazyattn.eval.harness import messages_for, parse_option, plan_cells

    if args.dataset is None:  # numerics, not accuracy: real prose, and the gold position changes nothing
        args.dataset = "builtin:real"
        args.gold_position = args.gold_position or "first"
    items, dataset_meta, num_docs, positions = load_questions(args)
    cells, _ = plan_cells(items, num_docs, positions)
    prompts = [fidelity.Prompt(messages_for(item), list(item.documents)) for _, shown in cells for item in shown]
    options = engine_options(args)
    options.pop("mode")
    options["random_weights"] = args.random_weights
    options.update(parse_option(o) for o in args.engine_option)
    device = options["device"]
    if device == "cpu":
        import torch

        torch.set_num_threads(args.cpu_threads)
    modes = parse_names(args.modes, MODES, "modes") if args.modes else [args.mode] if args.mode else list(MODES)
    dtypes = parse_names(args.dtypes, DTYPES, "dtypes")
    default_dtype = options.get("dtype") or ("float32" if device == "cpu" else "bfloat16")
    batch_dtypes = parse_names(args.batch_dtypes or default_dtype, DTYPES, "batch-dtypes")
    plan = fidelity.Plan(
        modes,
        list(dict.fromkeys(dtypes + batch_dtypes)),
        batch_dtypes,
        fidelity.batch_sizes(args.batch_sizes, len(prompts)),
    )
    options.pop("dtype", None)
    layout = prompt_layout(args)

    from lazyattn import LLM, SamplingParams

    def make_llm(engine: fidelity.Engine):
        extra = fidelity.reference_options(device) if engine.reference else {"dtype": engine.dtype}
        return LLM(**{**options, **extra, "mode": engine.mode, "layout": layout, "progress": False})

    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, first_token_logprobs=True)
    print(
        f"lazyattn eval --fidelity: model {args.model} on {device}, modes {', '.join(modes)}, dtypes "
        f"{', '.join(plan.dtypes)} (batch sizes {', '.join(map(str, plan.sizes))} for {', '.join(batch_dtypes)})\n"
        f"prompts: {len(prompts)} ({describe_dataset(dataset_meta)}; {'; '.join(c.label for c, _ in cells)}); "
        f"layout: {args.prompt_layout}; greedy, max {args.max_tokens} tokens\n",
        flush=True,
    )
    start = time.monotonic()
    total = fidelity.passes(plan)
    memo: dict = {}  # comparisons computed so far: the report is rewritten after every pass

    def report(results: dict, wall: float) -> tuple[list[dict], list[Path]]:
        """The table of the comparisons both of whose sides have run, written under --out (after every pass:
        what was measured survives a stop from outside; `"passes"` says how far the run got)."""
        comps = fidelity.comparisons(plan, results, memo)
        table_rows = fidelity.rows(comps)
        if not args.out:
            return table_rows, []
        out = Path(args.out)
        meta = {
            "command": "lazyattn " + shlex.join(sys.argv[1:]),
            "time": time.strftime("%Y-%m-%d %H:%M:%S"),
            "model": args.model,
            "device": _device_name(device),
            "engine_options": {k: v for k, v in options.items() if k != "env"},
            "layout": vars(layout),
            "max_tokens": args.max_tokens,
            "modes": modes,
            "dtypes": plan.dtypes,
            "batch_dtypes": batch_dtypes,
            "batch_sizes": plan.sizes,
            "passes": [len(results), total],
            "wall_s": wall,
            "python": platform.python_version(),
            "host": platform.node(),
        }
        fidelity_json = {
            "meta": meta,
            "dataset": dataset_meta,
            "comparisons": [
                {**c.summary(), "identical_each": c.identical, "kl_each": c.kl, "divergence_each": c.divergence}
                for c in comps
            ],
            "answers": {f"{e.label}, batch {size}": a.token_ids for (e, size), a in results.items()},
        }
        write_json(out / "fidelity.json", fidelity_json)
        partial = "" if len(results) == total else f"**Partial**: {len(results)} of {total} passes ran.\n\n"
        (out / "fidelity.md").write_text(
            f"# Fidelity: {Path(args.model).name}, {describe_dataset(dataset_meta)}\n\n"
            f"Device: {meta['device']}. Greedy, {args.max_tokens} tokens at most, layout {args.prompt_layout}.\n\n"
            f"```bash\n{meta['command']}\n```\n\n{partial}{fidelity.markdown_table(table_rows)}\n"
        )
        return table_rows, [out / "fidelity.json", out / "fidelity.md"]

    on_pass = (lambda done: report(done, time.monotonic() - start)) if args.out else None
    results = fidelity.run_plan(plan, prompts, make_llm, params, on_pass=on_pass)
    wall = time.monotonic() - start
    table_rows, written = report(results, wall)
    print(f"\n{fidelity.text_table(table_rows)}\n\n{len(results)} passes in {wall:.0f} s", flush=True)
    if written:
        print(f"wrote {', '.join(map(str, written))}")
    return 0


def _device_name(device: str) -> str:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    return f"CPU ({platform.processor() or platform.machine()}), torch {torch.__version__}"
