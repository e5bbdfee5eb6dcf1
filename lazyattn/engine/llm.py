"""The offline API: `LLM(...).generate(...)`, `.chat(...)` (README, "Using it from Python")."""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Sequence as Seq
from typing import Any

from tqdm import tqdm

from lazyattn.engine.best_document import (
    ORDERING,
    FirstRound,
    candidates,
    check_answer,
    choices,
    ordered_answers,
    pick_answers,
    placement_groups,
    with_confidence,
)
from lazyattn.engine.choice import Choice
from lazyattn.engine.config import EngineConfig
from lazyattn.engine.llm_engine import EngineStats, LLMEngine
from lazyattn.engine.outputs import RequestOutput
from lazyattn.engine.prompt import PromptLayout, RenderedPrompt, from_token_ids, render_chat, render_completion
from lazyattn.engine.request_options import ENGINE_DEFAULTS, RequestOptions
from lazyattn.engine.sampling import SamplingParams
from lazyattn.errors import InvalidRequestError

Document = str | dict[str, str]


class LLM:
    """An engine for offline batches.

    >>> llm = LLM(model="tiny", mode="lazy", device="cpu")
    >>> outs = llm.generate(["Who wrote it?"], SamplingParams(max_tokens=8, temperature=0.0),
    ...                     documents=[["doc text A", "doc text B"]])
    """

    def __init__(self, model: str = "tiny", mode: str = "lazy", device: str = "cpu", **options: Any) -> None:
        self.layout = options.pop("layout", None) or PromptLayout()
        self.config = EngineConfig(model=model, mode=mode, device=device, **options)
        self.engine = LLMEngine(self.config)
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def shutdown(self) -> None:
        """Give the engine's device memory back now (also on leaving a `with LLM(...) as llm:` block)."""
        self.engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- prompts ----------------------------------------------------------------------------------

    def render(self, prompt: str, documents: Seq[Document] = ()) -> RenderedPrompt:
        return render_completion(self.tokenizer, prompt, list(documents), self.layout)

    def render_chat(self, messages: list[dict[str, str]], documents: Seq[Document] = ()) -> RenderedPrompt:
        return render_chat(self.tokenizer, messages, list(documents), self.layout)

    # -- generation -------------------------------------------------------------------------------

    def generate(
        self,
        prompts: str | Seq[str] | None = None,
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        *,
        documents: Seq[Seq[Document]] | None = None,
        prompt_token_ids: Seq[Seq[int]] | None = None,
        document_token_ids: Seq[Seq[Seq[int]]] | None = None,
        cache_salt: str | None = None,
        use_tqdm: bool | None = None,
        options: RequestOptions | None = None,
        relink_tokens: int | None = None,
        relink_last_tokens: int | None = None,
        ape_temperature: float | None = None,
        ape_scale: float | None = None,
        ape_prefix: bool | None = None,
        ape_tilt: float | None = None,
        ape_parallel: bool | None = None,
        answer: str = "joint",
        confidence_tokens: int | None = None,
    ) -> list[RequestOutput]:
        """One output per prompt, in order. Text prompts are rendered with the RAG layout (system segment,
        one segment per document, the prompt as the final segment); token-level inputs bypass rendering.
        options: the requests' relink rows and APE settings (engine/request_options.py: relink_tokens and
        relink_last_tokens, lazy mode's recomputed first and last rows per placed document; ape_temperature,
        ape_scale, T and S on the final segment's attention to the documents after the first, lazy and block mode;
        ape_prefix, documents encoded after the first segment, lazy mode; ape_tilt, ln S from +tilt/2 on the first
        document to -tilt/2 on the last, lazy and block mode; ape_parallel, every document read from the first
        segment's end, lazy mode; docs/design.md, "Relink" and "APE"); each None: the
        engine's. The keywords of the same names are the same options, given one by one (not together with
        `options`).
        answer: "joint" (one request over all of a prompt's documents), "best-document" (the prompt asked once per
        document, with that document alone; the most confident answer kept, its document in `answered_from`),
        "best-document-or-joint" (the same, the prompt as given one more candidate), "confidence-order" (the
        prompt asked over all of its documents, ordered by how confidently it is answered from each alone, the most
        confident last, their order in `document_order`) or "confidence-order-or-joint" (the same, the prompt as given
        kept where its answer is at least as sure) or "each-last" (in one round, the prompt as given and once with
        each other document moved last, the most confident answer kept, its order in `document_order`) or
        "both-orders" (in one round, the prompt as given and with its documents reversed, the more confident answer
        kept, the reversed order in `document_order`) or "both-placements" (in one round, the documents read in
        order and read in parallel, `ape_parallel`, the more confident answer kept, `read_in_parallel` saying which;
        lazy mode; engine/best_document.py).
        confidence_tokens: with the two confidence-order strategies, the one-document answers that order the
        documents stop after that many tokens (None: the whole answer; only their confidence is used); with the
        others but "joint", the candidates are ranked by their first that many tokens and all but the surest stop
        there (engine/choice.py)."""
        _check_answer(answer, sampling_params, confidence_tokens)
        options = _options(
            options, relink_tokens, relink_last_tokens, ape_temperature, ape_scale, ape_prefix, ape_tilt, ape_parallel
        )
        if prompt_token_ids is not None:
            if prompts is not None:
                raise InvalidRequestError("give either prompts or prompt_token_ids, not both", "prompts")
            docs = _per_prompt(document_token_ids, len(prompt_token_ids), "document_token_ids")

            def render(o: int, d: list[Any]) -> RenderedPrompt:
                return self._from_ids(prompt_token_ids[o], d)

        else:
            if prompts is None:
                raise InvalidRequestError("no prompts given", "prompts")
            texts = [prompts] if isinstance(prompts, str) else list(prompts)
            docs = _per_prompt(documents, len(texts), "documents")

            def render(o: int, d: list[Any]) -> RenderedPrompt:
                return self.render(texts[o], d)

        return self._answer(render, docs, (answer, confidence_tokens), sampling_params, cache_salt, use_tqdm, options)

    def chat(
        self,
        messages: list[dict[str, str]] | Seq[list[dict[str, str]]],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        *,
        documents: Seq[Seq[Document]] | None = None,
        cache_salt: str | None = None,
        use_tqdm: bool | None = None,
        options: RequestOptions | None = None,
        relink_tokens: int | None = None,
        relink_last_tokens: int | None = None,
        ape_temperature: float | None = None,
        ape_scale: float | None = None,
        ape_prefix: bool | None = None,
        ape_tilt: float | None = None,
        ape_parallel: bool | None = None,
        answer: str = "joint",
        confidence_tokens: int | None = None,
    ) -> list[RequestOutput]:
        """Chat conversations rendered with the model's chat template, documents as segments; `options` (or its
        keywords), `answer` and `confidence_tokens` as in `generate`."""
        _check_answer(answer, sampling_params, confidence_tokens)
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        docs = _per_prompt(documents, len(convs), "documents", "conversation")
        options = _options(
            options, relink_tokens, relink_last_tokens, ape_temperature, ape_scale, ape_prefix, ape_tilt, ape_parallel
        )
        return self._answer(
            lambda o, d: self.render_chat(convs[o], d),
            docs,
            (answer, confidence_tokens),
            sampling_params,
            cache_salt,
            use_tqdm,
            options,
        )

    def stats(self) -> EngineStats:
        return self.engine.stats()

    # -- internals --------------------------------------------------------------------------------

    def _from_ids(self, prompt_token_ids: Seq[int], document_token_ids: Seq[Seq[int]]) -> RenderedPrompt:
        # BOS only for a model whose tokenizer adds one to text (SmolLM2's bos_token_id is <|im_start|>, which its
        # prompts never start with), as the server's token-level input does.
        want_bos = self.tokenizer.add_bos_token if self.layout.add_bos is None else self.layout.add_bos
        bos = self.tokenizer.bos_token_id if want_bos else None
        return from_token_ids(list(prompt_token_ids), [list(d) for d in document_token_ids], bos)

    def _answer(
        self,
        render: Callable[[int, list[Any]], RenderedPrompt],
        docs: list[Seq[Any]],
        asked: tuple[str, int | None],
        sampling_params: SamplingParams | Seq[SamplingParams] | None,
        cache_salt: str | None,
        use_tqdm: bool | None,
        options: RequestOptions,
    ) -> list[RequestOutput]:
        """Prompt r with documents `docs[r]`, asked as `asked` = (answer, confidence_tokens) says
        (engine/best_document.py): `render(r, d)` is its prompt over the documents d. The candidate requests run,
        then each prompt's are folded back into its most confident one, or (the confidence-order strategies) into the
        order of its documents for one more, joint, request, added as soon as that prompt's one-document answers are
        in (the request as given, where asked, still answering beside it)."""
        answer, confidence_tokens = asked
        params = _per_prompt_params(sampling_params, len(docs))
        owners, sets, sources = candidates(docs, answer)
        rendered = [render(o, d) for o, d in zip(owners, sets)]
        if answer == "joint":
            return self._run(rendered, params, cache_salt, use_tqdm, options)
        keep = [p.logprobs is not None for p in params]
        first = [with_confidence(params[o], src, confidence_tokens, answer) for o, src in zip(owners, sources)]
        if answer not in ORDERING:
            chosen = choices(owners, f"gen-choice-{next(self._ids)}-", answer, confidence_tokens)
            ids = self._add_groups(rendered, first, cache_salt, placement_groups(options, answer, sources), chosen)
            return pick_answers(owners, self._drain(ids, use_tqdm), sources, keep, confidence_tokens)
        ids = self._add(rendered, first, cache_salt, options)
        rounds = FirstRound(owners, sources, len(docs))
        candidate = {rid: i for i, rid in enumerate(ids)}
        joint_of: dict[str, int] = {}  # a joint request's id: its prompt
        joint: dict[int, RequestOutput] = {}
        with contextlib.closing(self._finish(ids, use_tqdm)) as finished:
            for rid, out in finished:
                if rid in joint_of:
                    joint[joint_of[rid]] = out
                    continue
                r = rounds.record(candidate[rid], out)
                if r is not None:
                    reordered = render(r, [docs[r][i] for i in rounds.orders[r]])
                    (jid,) = self._add([reordered], [with_confidence(params[r])], cache_salt, options)
                    joint_of[jid] = r
                    ids.append(jid)  # `finished` waits for it too
        orders = rounds.orders  # a request whose candidate failed after its joint round began answers that failure
        return ordered_answers(rounds.firsts, orders, {r: o for r, o in joint.items() if orders[r]}, keep)

    def _run(
        self,
        rendered: list[RenderedPrompt],
        sampling_params,
        cache_salt,
        use_tqdm,
        options: RequestOptions = ENGINE_DEFAULTS,
    ) -> list[RequestOutput]:
        """Queue one request per prompt and wait for all of them: their final outputs, in order."""
        return self._drain(self._add(rendered, sampling_params, cache_salt, options), use_tqdm)

    def _add(
        self,
        rendered: list[RenderedPrompt],
        sampling_params,
        cache_salt,
        options: RequestOptions = ENGINE_DEFAULTS,
        chosen: list[Choice | None] | None = None,
    ) -> list[str]:
        """Queue one request per prompt; their ids. All or nothing: a bad one fails before any is queued, or (the
        engine's own checks) takes back those queued before it. `chosen`: the choice each joins (engine/choice.py)."""
        params = _per_prompt_params(sampling_params, len(rendered))
        for p in params:  # fail before anything is queued: a bad request loses nothing
            p.validate(self.engine.model_config.vocab_size)
        self.engine.limits.options(options)
        ids = [f"gen-{next(self._ids)}" for _ in rendered]
        added: list[str] = []
        try:
            for rid, r, p, c in zip(ids, rendered, params, chosen or [None] * len(rendered)):
                self.engine.add_request(rid, r, p, cache_salt=cache_salt, options=options, choice=c)
                added.append(rid)
        except Exception:
            for rid in added:
                self.engine.abort(rid)
            raise
        return ids

    def _add_groups(
        self,
        rendered: list[RenderedPrompt],
        sampling_params: list[SamplingParams],
        cache_salt,
        groups: list[tuple[RequestOptions, list[int]]],
        chosen: list[Choice | None],
    ) -> list[str]:
        """`_add` of each group (options, the indices of the requests that ask with them), the ids in the given
        order; all or nothing as `_add`. `chosen[i]`: the choice request i joins."""
        ids: list[str | None] = [None] * len(rendered)
        try:
            for asked, which in groups:
                picked = [rendered[i] for i in which]
                added = self._add(
                    picked, [sampling_params[i] for i in which], cache_salt, asked, [chosen[i] for i in which]
                )
                for i, rid in zip(which, added):
                    ids[i] = rid
        except Exception:
            for rid in ids:
                if rid is not None:
                    self.engine.abort(rid)
            raise
        return ids  # type: ignore[return-value]

    def _drain(self, ids: list[str], use_tqdm: bool | None) -> list[RequestOutput]:
        """The final output of each request, in order."""
        done = dict(self._finish(ids, use_tqdm))
        return [done[rid] for rid in ids]

    def _finish(self, ids: list[str], use_tqdm: bool | None) -> Iterator[tuple[str, RequestOutput]]:
        """Step the engine until every request in `ids` has finished, yielding each (id, final output) as it does;
        the caller may append ids while it iterates. If stepping fails or the caller stops early (close), the
        unfinished ones are aborted."""
        show = self.config.progress if use_tqdm is None else use_tqdm
        done: set[str] = set()
        wanted: set[str] = set()  # `ids` as a set, grown with it (ids are unique)
        bar = tqdm(total=len(ids), desc="generate", disable=not show, dynamic_ncols=True)
        first = self.engine.stats()
        start = time.monotonic()
        try:
            while len(done) < len(ids):
                if len(wanted) < len(ids):
                    wanted.update(ids[len(wanted) :])
                    bar.total = len(ids)
                outs = self.engine.step()
                now = self.engine.stats()
                prefill_tok = now.prefilled_tokens - first.prefilled_tokens
                decode_tok = now.decoded_tokens - first.decoded_tokens
                for o in outs:
                    if o.finished and o.request_id in wanted and o.request_id not in done:
                        done.add(o.request_id)
                        bar.update(1)
                        yield o.request_id, o
                elapsed = max(time.monotonic() - start, 1e-9)
                bar.set_postfix_str(
                    f"prefill {prefill_tok / elapsed:.0f} tok/s, decode {decode_tok / elapsed:.0f} tok/s"
                )
                if not outs and not self.engine.has_unfinished():
                    break
        except BaseException:
            for rid in ids:
                if rid not in done:
                    self.engine.abort(rid)
            raise
        finally:
            bar.close()


def _per_prompt(documents: Seq[Seq[Any]] | None, count: int, param: str, what: str = "prompt") -> list[Seq[Any]]:
    """Each prompt's documents (none given: none for every prompt), each a list."""
    docs = list(documents) if documents is not None else [[] for _ in range(count)]
    if len(docs) != count:
        raise InvalidRequestError(f"{param} must have one list per {what}", param)
    for i, d in enumerate(docs):
        if isinstance(d, (str, bytes, Mapping)) or not isinstance(d, Seq):
            raise InvalidRequestError(f"{param}[{i}] must be a list, one per {what}, got {type(d).__name__}", param)
    return docs


def _per_prompt_params(
    sampling_params: SamplingParams | Seq[SamplingParams] | None, count: int
) -> list[SamplingParams]:
    """One SamplingParams per prompt: the defaults, the one given for all, or the list given."""
    if sampling_params is None:
        sampling_params = SamplingParams()
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * count
    params = list(sampling_params)
    if len(params) != count:
        raise InvalidRequestError("sampling_params must be one object or one per prompt", "sampling_params")
    return params


def _check_answer(
    answer: str, sampling_params: SamplingParams | Seq[SamplingParams] | None, confidence_tokens: object = None
) -> None:
    """`check_answer` with the first n other than 1 among the params (their own checks come later)."""
    given = [sampling_params] if isinstance(sampling_params, SamplingParams) else list(sampling_params or [])
    check_answer(answer, next((p.n for p in given if getattr(p, "n", 1) != 1), 1), confidence_tokens=confidence_tokens)


def _options(
    options: RequestOptions | None,
    relink_tokens: int | None,
    relink_last_tokens: int | None,
    ape_temperature: float | None,
    ape_scale: float | None,
    ape_prefix: bool | None,
    ape_tilt: float | None,
    ape_parallel: bool | None,
) -> RequestOptions:
    """`options`, or the one-by-one keywords of `generate` and `chat` as options."""
    loose = RequestOptions(
        relink_tokens, ape_temperature, ape_scale, ape_prefix, ape_tilt, relink_last_tokens, ape_parallel
    )
    if options is None:
        return loose
    if loose != ENGINE_DEFAULTS:
        raise InvalidRequestError(
            "give either options or the keywords relink_tokens, relink_last_tokens, ape_temperature, ape_scale, "
            "ape_prefix, ape_tilt, ape_parallel, not both",
            "options",
        )
    return options
