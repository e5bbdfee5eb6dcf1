"""The scheduler's admission and release through the engine, driven by random interleavings (hypothesis'
RuleBasedStateMachine): requests over a few shared documents in random orders, relinked first and last rows or the
parallel placement (lazy mode), candidates of one answer of which all but the surest stop after their first tokens
(engine/choice.py), aborts, document removals, cache resets while idle, prefill-only registrations, each engine step,
on a KV pool small enough to evict and preempt and with the host tier on, with and without overlapped scheduling.

After every step the engine's whole bookkeeping is checked (`LLMEngine.check`: every page held once, every refcount
equal to its holders, engine/invariants.py), and against the test's own model: every request ends exactly once with
at most max_tokens tokens, a candidate stopped by its choice had its first tokens by then, and an idle engine holds
no page but its cached documents' and no open choice.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from lazyattn import LLM, RequestOptions
from lazyattn.engine.choice import Choice
from lazyattn.engine.prompt import RenderedPrompt
from lazyattn.engine.request_options import ENGINE_DEFAULTS
from lazyattn.engine.sampling import SamplingParams
from lazyattn.errors import InvalidRequestError

DOCS = [[10 + d * 7 + i for i in range(n)] for d, n in enumerate([20, 33, 47, 60, 9])]  # token ids, 1 to 4 pages
PAGE = 16
POOL_PAGES = 16  # the fewest an engine takes: admission waits, documents are evicted, sequences preempted
_ENGINES: dict[tuple[str, bool], LLM] = {}
# what a request asks: up to three of the documents, a question of token ids, an answer's length
ASKED = {
    "docs": st.lists(st.integers(0, len(DOCS) - 1), min_size=0, max_size=3, unique=True),
    "question": st.lists(st.integers(3, 250), min_size=1, max_size=6),
    "max_tokens": st.integers(1, 24),
}


def engine_for(mode: str, overlap: bool) -> LLM:
    """One engine per configuration for the whole run (building one costs more than many steps); each example
    starts from an empty cache."""
    key = (mode, overlap)
    if key not in _ENGINES:
        probe = LLM(model="tiny", mode=mode, device="cpu", page_size=PAGE)
        page_bytes = probe.stats().page_bytes
        probe.shutdown()
        _ENGINES[key] = LLM(
            model="tiny",
            mode=mode,
            device="cpu",
            page_size=PAGE,
            kv_cache_gb=POOL_PAGES * page_bytes / 2**30,
            host_cache_gb=6 * page_bytes / 2**30 if mode in ("lazy", "block") else None,
            max_num_batched_tokens=64,
            async_scheduling=overlap,
            check_invariants=True,
        )
    return _ENGINES[key]


class EngineMachine(RuleBasedStateMachine):
    @initialize(mode=st.sampled_from(["lazy", "block", "prefix"]), overlap=st.booleans())
    def build(self, mode: str, overlap: bool) -> None:
        self.mode = mode
        self.llm = engine_for(mode, overlap)
        self.engine = self.llm.engine
        for request_id in list(self.engine.requests):
            self.engine.abort(request_id)
        self.engine.reset_cache()
        self.live: dict[str, int] = {}  # request id -> max_tokens (0: prefill-only)
        self.ended: set[str] = set()
        self.count = 0
        self.first_tokens: dict[str, int] = {}  # a candidate's id -> the tokens its choice ranks it by
        self.guided: dict[str, tuple[str, ...]] = {}  # a guided request's id -> its choices
        self.aborting: str | None = None

    def _add(
        self,
        prompt: RenderedPrompt,
        params: SamplingParams | None,
        options: RequestOptions = ENGINE_DEFAULTS,
        choice: Choice | None = None,
    ) -> None:
        self.count += 1
        request_id = f"r{self.count}"
        before = (self.engine.pool.num_used, self.engine.scheduler.num_waiting, len(self.engine.requests))
        try:
            self.engine.add_request(request_id, prompt, params, options=options, choice=choice)
        except InvalidRequestError:  # could never fit the pool: refused whole, nothing changed
            assert (self.engine.pool.num_used, self.engine.scheduler.num_waiting, len(self.engine.requests)) == before
            return
        self.live[request_id] = params.max_tokens * params.n if params is not None else 0
        if params is not None and params.guided_choice is not None:
            self.guided[request_id] = params.guided_choice
        if choice is not None:
            self.first_tokens[request_id] = choice.tokens

    @rule(
        **ASKED,
        n=st.integers(1, 2),
        stop=st.integers(3, 250),
        relink=st.tuples(st.sampled_from([0, 0, 3, 16, 40]), st.sampled_from([0, 0, 5, 16, 40])),
        parallel=st.booleans(),
    )
    def add(
        self,
        docs: list[int],
        question: list[int],
        max_tokens: int,
        n: int,
        stop: int,
        relink: tuple[int, int],
        parallel: bool,
    ) -> None:
        # A stop token ends some sequences early: with overlap their pages are released a step later.
        stops = [stop] if stop % 2 else []
        params = SamplingParams(
            max_tokens=max_tokens, temperature=0.0 if n == 1 else 0.7, seed=1, n=n, stop_token_ids=stops
        )
        # Relinked rows (lazy mode): private pages per sequence, recomputed runs before its own, whole documents
        # recomputed where first + last rows cover them.
        first, last = relink if self.mode == "lazy" else (0, 0)
        # Documents read in parallel (lazy mode, without relink): the final segment's positions shifted back
        parallel = parallel and self.mode == "lazy" and first == last == 0
        options = RequestOptions(relink_tokens=first, relink_last_tokens=last, ape_parallel=parallel)
        self._add(RenderedPrompt([list(DOCS[d]) for d in docs], question), params, options)

    @rule(
        **ASKED,
        n=st.integers(1, 2),
        choices=st.lists(st.sampled_from(["yes", "yes sir", "no", "maybe", "n"]), min_size=1, max_size=4),
    )
    def add_guided(self, docs: list[int], question: list[int], max_tokens: int, n: int, choices: list[str]) -> None:
        """A guided choice: its tokens are read before its next step is planned (no overlap for it)."""
        params = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=2, n=n, guided_choice=choices)
        self._add(RenderedPrompt([list(DOCS[d]) for d in docs], question), params)

    @rule(**ASKED, size=st.integers(2, 3), tokens=st.integers(1, 4))
    def add_candidates(self, docs: list[int], question: list[int], max_tokens: int, size: int, tokens: int) -> None:
        """The candidates of one answer: the same prompt, read in order and (lazy mode) in parallel in turn, all but
        the surest stopped after their first `tokens` tokens."""
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=0)
        prompt = RenderedPrompt([list(DOCS[d]) for d in docs], question)
        key = f"choice{self.count}"
        for i in range(size):
            options = RequestOptions(ape_parallel=self.mode == "lazy" and i % 2 == 1)
            self._add(prompt, params, options, Choice(key, i, size, tokens))

    @precondition(lambda self: self.mode != "prefix")
    @rule(docs=st.lists(st.integers(0, len(DOCS) - 1), min_size=1, max_size=2, unique=True))
    def register(self, docs: list[int]) -> None:
        """A prefill-only request (the server's document registration)."""
        self._add(RenderedPrompt([list(DOCS[d]) for d in docs], []), None)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def abort(self, data) -> None:
        request_id = data.draw(st.sampled_from(sorted(self.live)))
        self.aborting = request_id
        out = self.engine.abort(request_id)
        assert out is not None and out.finished
        self._ended(request_id, out)
        self.aborting = None

    @precondition(lambda self: self.mode != "prefix")
    @rule(doc=st.integers(0, len(DOCS) - 1))
    def remove_document(self, doc: int) -> None:
        self.engine.drop_documents([DOCS[doc]])

    @rule(steps=st.integers(1, 4))
    def step(self, steps: int) -> None:
        for _ in range(steps):
            if not self.engine.has_unfinished():
                break
            for out in self.engine.step():
                if out.finished:
                    self._ended(out.request_id, out)

    @precondition(lambda self: not self.live)
    @rule()
    def reset(self) -> None:
        self.engine.reset_cache()
        assert self.engine.pool.num_used == 0 and len(self.engine.cache) == 0

    def _ended(self, request_id: str, out) -> None:
        assert request_id in self.live and request_id not in self.ended, f"{request_id} ended twice"
        budget = self.live.pop(request_id)
        self.ended.add(request_id)
        assert sum(len(c.token_ids) for c in out.outputs) <= budget
        assert all(c.finish_reason in ("stop", "length", "abort") for c in out.outputs)
        for c in out.outputs if request_id in self.guided else ():  # a choice, or cut short of one
            cut = c.finish_reason in ("length", "abort")
            assert any(x == c.text or (cut and x.startswith(c.text)) for x in self.guided[request_id]), c.text
        if request_id in self.first_tokens and out.finish_reason == "abort" and request_id != self.aborting:
            assert len(out.token_ids) >= self.first_tokens[request_id]  # stopped by its choice: ranked, then stopped

    @invariant()
    def bookkeeping(self) -> None:
        if not hasattr(self, "engine"):
            return
        self.engine.check()
        assert set(self.engine.requests) == set(self.live)
        if not self.live:  # idle: nothing in flight, only cached documents hold pages
            assert not self.engine.step_in_flight and not self.engine.scheduler.ended
            assert self.engine.pool.num_used == self.engine.cache.stats().pages_in_use
            assert len(self.engine.choices) == 0

    def teardown(self) -> None:
        if hasattr(self, "engine"):
            while self.engine.has_unfinished():  # everything admitted finishes
                for out in self.engine.step():
                    if out.finished:
                        self._ended(out.request_id, out)
            self.bookkeeping()
            assert not self.live


EngineMachine.TestCase.settings = settings(
    max_examples=25, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck)
)
test_engine_admission_and_release = EngineMachine.TestCase
