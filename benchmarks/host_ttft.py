"""The host's share of a cached RAG request's time to first token, on the CPU (no GPU needed).

The request of benchmarks/engine.py's `ttft_rag` (BOS + 31-token system segment, 5 cached 2048-token documents, a
32-token question) goes through the real engine (add_request, then `step` until its token is back, overlapped
scheduling on as on CUDA) with the forward pass replaced by its host half: the prefill-graph path's staging of the
step's inputs (engine/prefill_graphs.py, StepLayout.fill, into CPU buffers of the graphs' shapes) and fixed
logits. What is timed is everything the host does between the request's submission and the graph launch, and
between the graph's end and the first token being returned, less the few CUDA calls (copies, event, replay) the
CPU cannot make. The model is a small random Llama with a 4096-token vocabulary: the host code does not depend on
the model's size, and sampling a small vocabulary keeps the CPU's arithmetic out of the numbers.

    python -m benchmarks.host_ttft [--repeats 200] [--profile] [--out FILE.json] [--compare OTHER_CHECKOUT]
                                   [--fresh-ints]

prints the median µs of each phase (PHASES: what the host does before the launch, after it while a GPU would run
the forward pass, and once the token is back) and the sums; `--profile` adds a cProfile of the whole path, by own
time. `--compare DIR` measures this checkout and the one at DIR (e.g. main's) in alternating processes, `--rounds`
times each, and prints the medians of both and their ratios (this one / DIR's): a before/after in one run.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first triton import
import lazyattn  # noqa: E402
from lazyattn import SamplingParams  # noqa: E402
from lazyattn.engine.config import EngineConfig  # noqa: E402
from lazyattn.engine.graph_inputs import StepInputs  # noqa: E402
from lazyattn.engine.llm_engine import LLMEngine  # noqa: E402
from lazyattn.engine.prefill_graphs import StepLayout, pick_bucket  # noqa: E402
from lazyattn.engine.prompt import RenderedPrompt  # noqa: E402
from lazyattn.kernels.paged import cdiv  # noqa: E402

VOCAB = 4096
SYSTEM, DOC, DOCS, QUESTION = 32, 2048, 5, 32
MAX_MODEL_LEN = 16384
PLAN_SPLITS = 16

SMALL_LLAMA = {  # Llama-3.1's layout (rope_scaling included) at toy sizes
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "bos_token_id": 1,
    "eos_token_id": [2],
    "head_dim": 32,
    "hidden_act": "silu",
    "hidden_size": 128,
    "intermediate_size": 256,
    "max_position_embeddings": 131072,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "vocab_size": VOCAB,
    "rope_scaling": {
        "factor": 8.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
}


def random_tokens(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1000, VOCAB, (n,), generator=g).tolist()


class HostOnly:
    """ModelRunner.execute's host half on the prefill-graph path: stage the step into buffers of the graphs'
    layout (what PrefillGraphs.run does before its copies and replay), return fixed logits."""

    def __init__(self, engine: LLMEngine) -> None:
        self.width = min(cdiv(MAX_MODEL_LEN, engine.config.page_size), engine.executor.num_pages)
        try:  # the split plan's host share: on an H100 the question's bucket splits 16 ways (kernels/prefill.py)
            self.layout = StepLayout(128, 64, self.width, engine.config.page_size, PLAN_SPLITS)
            self.splits: tuple[int, ...] = (PLAN_SPLITS,)
        except TypeError:  # a checkout from before split plans (--compare)
            self.layout = StepLayout(128, 64, self.width, engine.config.page_size)
            self.splits = ()
        self.staging = self.layout.buffers("cpu")
        self.logits = torch.randn(64, VOCAB, generator=torch.Generator().manual_seed(0))
        self.staged = 0
        self.launched_at = 0.0  # when the last staged step would have been replayed

    def __call__(self, step: StepInputs) -> torch.Tensor:
        bucket = pick_bucket(step, self.width)
        if bucket is not None:
            self.layout.fill(self.staging, step, *bucket, *self.splits)
            self.staged += 1
            self.launched_at = time.perf_counter()
        return self.logits[: len(step.logits_rows)]


def build(config_dir: Path) -> tuple[LLMEngine, HostOnly]:
    (config_dir / "config.json").write_text(json.dumps(SMALL_LLAMA))
    engine = LLMEngine(
        EngineConfig(
            model=str(config_dir),
            mode="lazy",
            device="cpu",
            random_weights=True,
            kv_cache_gb=0.1,
            max_model_len=MAX_MODEL_LEN,
            async_scheduling=True,
            progress=False,
        )
    )
    host = HostOnly(engine)
    engine.executor.runner.execute = host  # the forward pass is the GPU's: out of the host's numbers
    return engine, host


class Request:
    def __init__(self, engine: LLMEngine, host: HostOnly, fresh_ints: bool = False) -> None:
        self.engine = engine
        self.fresh_ints = fresh_ints
        self.host = host
        self.system = [SMALL_LLAMA["bos_token_id"]] + random_tokens(SYSTEM - 1, 1)
        self.docs = [random_tokens(DOC, 10 + i) for i in range(DOCS)]
        self.params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        self.n = 0

    def cache_documents(self) -> None:
        self.engine.add_request("docs", RenderedPrompt(segments=[self.system] + self.docs, final=[]), None)
        while self.engine.has_unfinished():
            self.engine.step()

    def prompt(self, seed: int) -> RenderedPrompt:
        # Fresh lists: nothing is shared with the previous request but the int objects, as the document
        # tokenisation memo hands ids out (copies of one stored sequence). fresh_ints: new int objects too, as a
        # tokenizer's own output (no memo) has them.
        if self.fresh_ints:
            segments = [[int(str(t)) for t in s] for s in [self.system] + self.docs]
        else:
            segments = [list(s) for s in [self.system] + self.docs]
        return RenderedPrompt(segments=segments, final=random_tokens(QUESTION, seed))

    def once(self) -> tuple[float, float, float, float]:
        """Seconds of one request's phases (PHASES), the graph launch being the end of HostOnly's staging."""
        self.n += 1
        prompt = self.prompt(1000 + self.n)
        t0 = time.perf_counter()
        self.engine.add_request(f"r{self.n}", prompt, self.params)
        t1 = time.perf_counter()
        outs = self.engine.step()
        t2 = time.perf_counter()
        while not outs:
            outs = self.engine.step()
        t3 = time.perf_counter()
        assert outs[0].finished and len(outs[0].outputs[0].token_ids) == 1, outs
        assert outs[0].metrics.cached_tokens == SYSTEM + DOCS * DOC, outs[0].metrics
        launch = self.host.launched_at
        assert t1 < launch < t2
        return t1 - t0, launch - t1, t2 - launch, t3 - t2


# add_request; the step that launches the forward pass, until the launch and after it (on a GPU, hidden behind the
# forward pass); the step that returns the token; exposed = the host time a GPU would wait for (all but after_launch)
PHASES = ("add_request", "to_launch", "after_launch", "return_step", "exposed", "total")


def measure(repeats: int, profile: bool, fresh_ints: bool = False) -> dict[str, float]:
    """Median µs of each phase over `repeats` requests, after a warm-up."""
    with tempfile.TemporaryDirectory() as tmp:
        engine, host = build(Path(tmp))
        request = Request(engine, host, fresh_ints)
        request.cache_documents()
        for _ in range(20):
            request.once()
        staged = host.staged
        times = [request.once() for _ in range(repeats)]
        assert host.staged - staged == repeats  # every request's step took the prefill-graph path
        medians = {name: 1e6 * statistics.median(t[i] for t in times) for i, name in enumerate(PHASES[:4])}
        medians["exposed"] = 1e6 * statistics.median(t[0] + t[1] + t[3] for t in times)
        medians["total"] = 1e6 * statistics.median(sum(t) for t in times)
        if profile:
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(repeats):
                request.once()
            profiler.disable()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(40)
            print(text.getvalue())
    return medians


def compare(other: Path, repeats: int, rounds: int, fresh_ints: bool = False) -> dict:
    """This checkout against `other`, in alternating processes; per phase the median over rounds of each."""
    runs: dict[str, list[dict[str, float]]] = {"this": [], "other": []}
    for _ in range(rounds):
        for name, tree in (("this", Path(__file__).resolve().parents[1]), ("other", other)):
            # PYTHONPATH puts the tree's lazyattn ahead of any installed one in the child process.
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}
            out = subprocess.run(
                [sys.executable, __file__, "--repeats", str(repeats), "--json"]
                + (["--fresh-ints"] if fresh_ints else []),
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            runs[name].append(json.loads(out.splitlines()[-1]))
    summary = {name: {k: statistics.median(r[k] for r in rs) for k in PHASES} for name, rs in runs.items()}
    summary["ratio"] = {k: summary["this"][k] / summary["other"][k] for k in PHASES}
    summary["rounds"] = runs
    return summary


def cpu_name() -> str:
    try:
        names = [
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ]
    except OSError:
        names = []
    return f"{names[0]} ({len(names)} logical CPUs)" if names else platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--profile", action="store_true", help="also print a cProfile of the path")
    parser.add_argument("--out", type=Path, help="write the results as JSON")
    parser.add_argument("--compare", type=Path, help="another checkout to measure against (before/after)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating processes per checkout (--compare)")
    parser.add_argument("--json", action="store_true", help="print the medians as one JSON line")
    parser.add_argument(
        "--fresh-ints",
        action="store_true",
        help="documents as new int objects each request (a tokenizer's output), not copied lists",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.compare is not None:
        results = compare(args.compare.resolve(), args.repeats, args.rounds, args.fresh_ints)
        for name in ("this", "other", "ratio"):
            unit = "" if name == "ratio" else " µs"
            print(f"{name:6s} " + ", ".join(f"{k} {v:.3g}{unit}" for k, v in results[name].items()))
    else:
        results = measure(args.repeats, args.profile, args.fresh_ints)
        if args.json:
            print(json.dumps(results))
        else:
            print(
                f"host µs per request (median of {args.repeats}): "
                + ", ".join(f"{k} {v:.1f}" for k, v in results.items())
            )
    if args.out is not None:
        meta = {
            "command": " ".join(
                ["python", "-m", "benchmarks.host_ttft"] + (argv if argv is not None else sys.argv[1:])
            ),
            "cpu": cpu_name(),
            "python": platform.python_version(),
            "lazyattn": str(Path(lazyattn.__file__).resolve().parent),
        }
        args.out.write_text(json.dumps({"meta": meta, "host_us": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
