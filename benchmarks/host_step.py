"""The host's time per decode step at large batches, on the CPU (no GPU needed), by phase.

The real engine (lazy mode, pages of 64, overlapped scheduling as on CUDA) runs N sequences of the paper's RAG
workload: BOS + 31-token system segment, 5 documents of 2048 tokens drawn from a pool of 100 cached ones (each
sequence lists ~165 pages), a 32-token question. The forward pass is replaced by its host half on the CUDA-graph
decode path (DecodeGraphs.run before its copies and replay: the step's ids, positions, slots and page tables staged
into buffers of the graphs' layout, and, with `--shared`, the shared-document plan staged as the plan graph takes
it) and fixed logits; sampling by fixed ids (on a GPU it is two kernel launches). What is left is what the host
does per decode step that the GPU would wait for once it exceeds the forward pass.

    python -m benchmarks.host_step [--batches 32 128 256] [--steps 20] [--shared on|off|both] [--steady]
                                   [--split] [--gc-freeze] [--icl] [--relink-last M] [--profile]
                                   [--compare OTHER_CHECKOUT] [--rounds N] [--json]

prints per batch size and shared-decode setting the median ms per step of each phase (PHASES), their total, and
the time the garbage collector took within the step, and, apart, what one full collection costs with that batch
running; each setting runs in a fresh process (`--rounds` of them, the medians' median). `--steady`: the serving
benchmark's steady state at a full batch instead of pure decode steps: requests of OUTPUT tokens, each replaced as
it ends, so that most steps decode most sequences and prefill the new ones' questions; such a step takes no graph
(its inputs are staged for an eager pass, PagedBatch.build, and the eager pass's own launches are left out).
`--split`, `--gc-freeze`: those engine options on (this checkout). `--icl`: the few-shot workload of
docs/quality.md's in-context learning at 8B shapes instead (a pool of 40 demonstrations of 32 tokens, 20 a request in
their own order, a 32-token test input, 8 output tokens, the shared prefix on); `--relink-last M`: each document's
last M rows recomputed in the request's context (`relink_last_tokens`, both checkouts). `--profile` prints a
cProfile of the timed steps instead, by own time. `--compare DIR` measures this checkout and the one at DIR (e.g.
main's) in alternating processes and prints both tables.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import pstats
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first triton import (the planner's module)
from lazyattn import SamplingParams  # noqa: E402
from lazyattn.engine.config import EngineConfig  # noqa: E402
from lazyattn.engine.graph_inputs import (  # noqa: E402
    SharedDecode,
    StepInputs,
    fill_plan,
    fill_tables,
    plan_buffer_size,
    table_count,
)
from lazyattn.engine.llm_engine import LLMEngine  # noqa: E402
from lazyattn.engine.prefill_graphs import pick_bucket  # noqa: E402
from lazyattn.engine.prompt import RenderedPrompt  # noqa: E402
from lazyattn.engine.request_options import RequestOptions  # noqa: E402
from lazyattn.engine.sampling import SampleResult  # noqa: E402
from lazyattn.kernels.paged import cdiv  # noqa: E402

VOCAB = 4096
SYSTEM, DOC, POOL, DOCS, QUESTION = 32, 2048, 100, 5, 32
PAGE = 64
OUTPUT = 16  # tokens per request in the steady state (--steady)
ICL = False  # --icl: the few-shot workload (ICL_SHAPE) with the shared prefix
ICL_SHAPE = {"DOC": 32, "POOL": 40, "DOCS": 20, "QUESTION": 32, "OUTPUT": 8}
RELINK_LAST = 0  # --relink-last: RequestOptions.relink_last_tokens of every request
SPLIT = False  # --split: EngineConfig.split_mixed_steps
GC_FREEZE = False  # --gc-freeze: EngineConfig.gc_freeze
MAX_MODEL_LEN = 16384
MAX_BATCH = 256
GROUP = 4  # Llama-3.1-8B: 32 query heads over 8 kv heads

SMALL_LLAMA = {  # Llama-3.1's layout at toy sizes (no forward pass runs: only the page pool's size depends on it)
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "bos_token_id": 1,
    "eos_token_id": [2],
    "head_dim": 16,
    "hidden_act": "silu",
    "hidden_size": 128,
    "intermediate_size": 256,
    "max_position_embeddings": 131072,
    "num_attention_heads": 8,
    "num_hidden_layers": 1,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "vocab_size": VOCAB,
}

# schedule: Scheduler.schedule (with overlap's continuation, the runs advanced past the plan); describe:
# ModelRunner.describe; stage: the graph inputs' staging less the plan; plan: the shared-document plan and its
# staging; sample: the launcher's sampling (fixed ids here); read: Scheduler.update, a step's tokens applied (encodes
# ready, append, detokenise, stop checks, finish, release); outputs: the RequestOutputs a step returns; other: the
# rest of LLMEngine.step
PHASES = ("schedule", "describe", "stage", "plan", "sample", "read", "outputs", "other", "total")
# gc: time in Python's cyclic garbage collector during the step, whichever phase it interrupted (not in the sum)
EXTRA = ("gc", "collections")


def random_tokens(n: int, rng: random.Random) -> list[int]:
    return [rng.randrange(1000, VOCAB) for _ in range(n)]


class Timers:
    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PHASES + EXTRA, 0.0)
        self._gc_start = 0.0
        gc.callbacks.append(self._gc)

    def _gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.seconds["gc"] += time.perf_counter() - self._gc_start
            self.seconds["collections"] += 1

    def wrap(self, name: str, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - t

        return timed

    def reset(self) -> None:
        self.seconds = dict.fromkeys(PHASES + EXTRA, 0.0)

    def close(self) -> None:
        gc.callbacks.remove(self._gc)


class GraphStaging:
    """DecodeGraphs.run's host half (engine/cuda_graphs.py) into CPU buffers of its layout, then fixed logits."""

    def __init__(self, timers: Timers, shared: SharedDecode | None) -> None:
        from lazyattn.kernels.shared_decode import job_width

        n, width = MAX_BATCH, cdiv(MAX_MODEL_LEN, PAGE)
        self.i64 = np.zeros(3 * n, dtype=np.int64)
        self.head = np.zeros(2 * n, dtype=np.int32)
        self.tables = np.zeros((n, table_count(False), width), dtype=np.int32)
        self.shared = shared
        self.plan_staging = np.zeros(
            plan_buffer_size(
                n, (shared.jobs_per_entry if shared else 1) * n, job_width(shared.members if shared else 1)
            ),
            dtype=np.int32,
        )
        self.logits = torch.zeros(n + 8 * QUESTION, VOCAB)
        self.timers = timers
        self.decode_steps = 0
        self.plans = 0
        self.eager: Callable | None = None  # ModelRunner.to_device: the eager path's inputs, for the other steps
        self.eager_steps = 0

    def __call__(self, step: StepInputs) -> torch.Tensor:
        b = len(step.tokens)
        if step.is_decode:
            self.decode_steps += 1
            t = time.perf_counter()
            n = MAX_BATCH
            size = b  # the padded size's rows cost the same few slice writes
            i64, head = self.i64, self.head
            i64[:b] = step.tokens
            i64[n : n + b] = step.positions
            i64[2 * n : 2 * n + b] = step.slots
            i64[2 * n + b : 2 * n + size] = -1
            head[:b] = step.q_starts
            head[n : n + b] = [len(e.pages) for e in step.entries]
            fill_tables(self.tables, step.entries)
            t1 = time.perf_counter()
            self.timers.seconds["stage"] += t1 - t
            if self.shared is not None:
                plan = self.shared.plan(step)
                if plan is not None and plan.num_slots <= self.shared.jobs_per_entry * b:
                    fill_plan(self.plan_staging, plan, n)
                    self.plans += 1
                self.timers.seconds["plan"] += time.perf_counter() - t1
        elif self.eager is not None and pick_bucket(step, cdiv(MAX_MODEL_LEN, PAGE)) is None:
            # A step no graph takes (a decode step with new requests' questions at large batches): its inputs as
            # tensors (PagedBatch.build), then an eager forward pass whose launches this leaves out.
            self.eager_steps += 1
            t = time.perf_counter()
            self.eager(step)
            self.timers.seconds["stage"] += time.perf_counter() - t
        return self.logits[: len(step.logits_rows)]


def fixed_sampler(ids: torch.Tensor) -> Callable:
    def sample(logits, params, generators, suppress_token_ids=None) -> SampleResult:
        b = logits.shape[0]
        return SampleResult(ids[:b].clone(), torch.zeros(b))

    return sample


def build(config_dir: Path, shared: bool) -> tuple[LLMEngine, Timers, GraphStaging]:
    (config_dir / "config.json").write_text(json.dumps(SMALL_LLAMA))
    engine = LLMEngine(
        EngineConfig(
            model=str(config_dir),
            mode="lazy",
            device="cpu",
            random_weights=True,
            kv_cache_gb=0.1,
            page_size=PAGE,
            max_model_len=MAX_MODEL_LEN,
            max_num_seqs=MAX_BATCH,
            async_scheduling=True,
            progress=False,
            **({"split_mixed_steps": True} if SPLIT else {}),
            **({"gc_freeze": True} if GC_FREEZE else {}),
        )
    )
    timers = Timers()
    runner = engine.executor.runner
    staging = GraphStaging(timers, SharedDecode(group=GROUP) if shared else None)
    runner.execute = staging  # the forward pass is the GPU's: out of the host's numbers
    runner.describe = timers.wrap("describe", runner.describe)
    sched = engine.scheduler
    sched.schedule = timers.wrap("schedule", sched.schedule)
    engine.sampler.sample = fixed_sampler(torch.randint(1000, VOCAB, (MAX_BATCH,)))
    engine.launcher._sample = timers.wrap("sample", engine.launcher._sample)
    sched.update = timers.wrap("read", sched.update)
    engine.outputs.output = timers.wrap("outputs", engine.outputs.output)
    return engine, timers, staging


class Workload:
    """The pool of cached documents and the requests over it."""

    def __init__(self, engine: LLMEngine, seed: int = 0) -> None:
        self.engine = engine
        self.rng = random.Random(seed)
        self.system = [SMALL_LLAMA["bos_token_id"]] + random_tokens(SYSTEM - 1, self.rng)
        self.docs = [random_tokens(DOC, self.rng) for _ in range(POOL)]
        self.added = 0
        for i, doc in enumerate(self.docs):
            engine.add_request(f"doc{i}", RenderedPrompt(segments=[self.system, doc], final=[]), None)
        while engine.has_unfinished():
            engine.step()

    def add(self, max_tokens: int) -> None:
        chosen = self.rng.sample(range(POOL), DOCS)
        segments = [list(self.system)] + [list(self.docs[j]) for j in chosen]
        prompt = RenderedPrompt(segments=segments, final=random_tokens(QUESTION, self.rng))
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        options = RequestOptions(ape_prefix=ICL or None, relink_last_tokens=RELINK_LAST or None)
        self.engine.add_request(f"r{self.added}", prompt, params, options=options)
        self.added += 1


def fill(engine: LLMEngine, batch: int, max_tokens: int) -> None:
    """Cache the pool's documents, then start `batch` requests and step until every one decodes."""
    work = Workload(engine)
    for _ in range(batch):
        work.add(max_tokens)
    while engine.scheduler.num_waiting or any(not s.output for s in engine.scheduler.running):
        engine.step()
    assert len(engine.scheduler.running) == batch


def measure_steady(batch: int, shared: bool, steps: int, warm: int = 40) -> dict[str, float]:
    """Median ms per step of each phase, `batch` requests of OUTPUT tokens kept in the engine: each finished one is
    replaced at once, so that a step decodes ~batch * (1 - 1/OUTPUT) sequences and prefills the questions of the
    others (the serving benchmark's steady state at max_num_seqs)."""
    with tempfile.TemporaryDirectory() as tmp:
        engine, timers, staging = build(Path(tmp), shared)
        staging.eager = engine.executor.runner.to_device
        work = Workload(engine)
        for i in range(batch):
            work.add(1 + i % OUTPUT)  # staggered: as many end in every step
        for _ in range(warm):
            done = sum(o.finished for o in engine.step())
            for _ in range(done):
                work.add(OUTPUT)
        per_step = []
        staging.eager_steps = staging.decode_steps = 0
        for _ in range(steps):
            timers.reset()
            t = time.perf_counter()
            outs = engine.step()
            timers.seconds["total"] = time.perf_counter() - t
            per_step.append(dict(timers.seconds))
            for _ in range(sum(o.finished for o in outs)):
                work.add(OUTPUT)
        for s in per_step:
            s["other"] = s["total"] - sum(v for k, v in s.items() if k not in ("other", "total") + EXTRA)
        result = {k: 1e3 * statistics.median(s[k] for s in per_step) for k in PHASES + ("gc",)}
        result["collections"] = statistics.mean(s["collections"] for s in per_step)
        result["eager_share"] = staging.eager_steps / steps
        result["decode_share"] = staging.decode_steps / steps
        timers.close()
        engine.shutdown()
    return result


def measure(batch: int, shared: bool, steps: int, warm: int = 3, profile: bool = False) -> dict[str, float]:
    """Median ms per decode step of each phase, over `steps` steps after `warm` ones."""
    with tempfile.TemporaryDirectory() as tmp:
        engine, timers, staging = build(Path(tmp), shared)
        fill(engine, batch, max_tokens=warm + steps + 4)
        pages = statistics.mean(len(engine.scheduler.mode.context(s, PAGE).pages) for s in engine.scheduler.running)
        for _ in range(warm):
            engine.step()
        per_step = []
        profiler = cProfile.Profile() if profile else None
        decode_steps, plans = staging.decode_steps, staging.plans
        for _ in range(steps):
            timers.reset()
            if profiler:
                profiler.enable()
            t = time.perf_counter()
            engine.step()
            timers.seconds["total"] = time.perf_counter() - t
            if profiler:
                profiler.disable()
            per_step.append(dict(timers.seconds))
        assert len(engine.scheduler.running) == batch, "a sequence ended while timed"
        t = time.perf_counter()
        gc.collect()  # what a full collection, rare but in some step, costs with this batch running
        full_gc = time.perf_counter() - t
        assert staging.decode_steps - decode_steps == steps, "a timed step was not a decode step"
        if shared:
            assert staging.plans - plans == steps, "a timed step had no shared plan"
        for s in per_step:
            s["other"] = s["total"] - sum(v for k, v in s.items() if k not in ("other", "total") + EXTRA)
        result = {k: 1e3 * statistics.median(s[k] for s in per_step) for k in PHASES + ("gc",)}
        result["collections"] = statistics.mean(s["collections"] for s in per_step)
        timers.close()
        engine.shutdown()
        result["context_pages"] = pages
        result["full_gc"] = 1e3 * full_gc
        if profiler:
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
            print(text.getvalue(), file=sys.stderr)
    return result


def run_one(
    tree: Path, batch: int, shared: bool, steps: int, steady: bool, split: bool, freeze: bool, workload: list[str]
) -> dict[str, float]:
    """measure() in a fresh process on the checkout at `tree` (each engine alone in its process: no garbage of
    another one in the collector's way)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}
    args = ["--one", str(batch), "on" if shared else "off", "--steps", str(steps)] + (["--steady"] if steady else [])
    args += (["--split"] if split else []) + (["--gc-freeze"] if freeze else []) + workload
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.host_step", *args],
        cwd=tree,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.splitlines()[-1])


def table(rows: list[dict], title: str) -> str:
    lines = [title, "| N | shared | " + " | ".join(PHASES) + " | ms/seq | gc | collections |"]
    lines.append("|---" * (len(PHASES) + 5) + "|")
    for r in rows:
        cells = " | ".join(f"{r[k]:.2f}" for k in PHASES)
        lines.append(
            f"| {r['batch']} | {'on' if r['shared'] else 'off'} | {cells} | {r['total'] / r['batch']:.3f} "
            f"| {r['gc']:.2f} | {r['collections']:.1f} |"
            + (
                f" eager passes {r['eager_share']:.2f}, graph decode passes {r['decode_share']:.2f} per step"
                if "eager_share" in r
                else ""
            )
            + (f" full collection {r['full_gc']:.0f} ms" if "full_gc" in r else "")
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 128, 256])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--shared", choices=("on", "off", "both"), default="both")
    parser.add_argument("--profile", action="store_true", help="cProfile the timed steps (in this process)")
    parser.add_argument("--compare", type=Path, help="another checkout to measure against (before/after)")
    parser.add_argument("--rounds", type=int, default=1, help="processes per checkout and setting (alternating)")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON line")
    parser.add_argument(
        "--steady", action="store_true", help=f"requests of {OUTPUT} tokens replaced as they end (mixed steps)"
    )
    parser.add_argument("--split", action="store_true", help="split_mixed_steps on (this checkout's engine option)")
    parser.add_argument("--gc-freeze", action="store_true", help="gc_freeze on (this checkout's engine option)")
    parser.add_argument("--icl", action="store_true", help="the few-shot workload (module docstring)")
    parser.add_argument("--relink-last", type=int, default=0, help="relink_last_tokens of every request")
    parser.add_argument("--one", nargs=2, metavar=("BATCH", "SHARED"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    global SPLIT, GC_FREEZE, ICL, RELINK_LAST
    SPLIT, GC_FREEZE, ICL, RELINK_LAST = args.split, args.gc_freeze, args.icl, args.relink_last
    if ICL:
        globals().update(ICL_SHAPE)
    workload = (["--icl"] if args.icl else []) + (["--relink-last", str(args.relink_last)] if args.relink_last else [])
    if args.one is not None:
        how = measure_steady if args.steady else measure
        print(json.dumps(how(int(args.one[0]), args.one[1] == "on", args.steps)))
        return 0
    settings = {"on": [True], "off": [False], "both": [False, True]}[args.shared]
    if args.profile:
        for shared in settings:
            for batch in args.batches:
                measure(batch, shared, args.steps, profile=True)
        return 0
    here = Path(__file__).resolve().parents[1]
    trees = {"this": here} if args.compare is None else {"this": here, "other": args.compare.resolve()}
    rounds = args.rounds
    rows: dict[str, list[dict]] = {name: [] for name in trees}
    for shared in settings:
        for batch in args.batches:
            runs: dict[str, list[dict]] = {name: [] for name in trees}
            for _ in range(rounds):
                for name, tree in trees.items():
                    this = name == "this"
                    options = (args.steady, args.split and this, args.gc_freeze and this)
                    runs[name].append(run_one(tree, batch, shared, args.steps, *options, workload))
            for name, rs in runs.items():
                keys = (
                    PHASES + ("gc", "collections") + (("eager_share", "decode_share") if args.steady else ("full_gc",))
                )
                rows[name].append(
                    {"batch": batch, "shared": shared, **{k: statistics.median(r[k] for r in rs) for k in keys}}
                )
    if args.json:
        print(json.dumps(rows))
        return 0
    what = "step, steady state" if args.steady else "decode step"
    what += ", split_mixed_steps on (this checkout)" if args.split else ""
    what += ", gc_freeze on (this checkout)" if args.gc_freeze else ""
    what += ", the few-shot workload" if args.icl else ""
    what += f", relink_last_tokens {args.relink_last}" if args.relink_last else ""
    for name, tree in trees.items():
        print(
            table(
                rows[name],
                f"{name} ({tree}): host ms per {what} (median of {args.steps} steps"
                f"{f', median of {rounds} processes' if rounds > 1 else ''}), lazy mode, page size {PAGE}",
            )
        )
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
