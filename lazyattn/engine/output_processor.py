"""After sampling: what each token adds to its sequence (detokenised text, logprobs) and whether it stops it, and
the outputs that `generate` returns and the server streams.

The output processor reads sequences and never changes them: the scheduler, which owns every change of a sequence's
state (docs/design.md, "One step"), applies the `NewToken` it returns. Only the sequence's detokenizer advances
here, as it is fed each token in order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lazyattn.engine.guided import ChoiceGuide
from lazyattn.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from lazyattn.engine.prompt import RenderedPrompt
from lazyattn.engine.sampling import SampleResult
from lazyattn.engine.sequence import Sequence
from lazyattn.model.detokenizer import IncrementalDecoder
from lazyattn.model.tokenizer import TokenizerBase


@dataclass(frozen=True)
class NewToken:
    """What one sampled token adds to its sequence (Scheduler.update appends it)."""

    token: int
    text: str  # the text the detokenizer released with it (complete characters, stop strings cut off)
    logprobs: dict[int, float] | None  # {token id: logprob}, the chosen one first; None unless asked for
    first_token_logprobs: torch.Tensor | None  # the first token's full row, when asked for; else None
    finish_reason: str | None  # "stop" or "length" if the token ends the sequence
    stop_reason: str | int | None = None  # the stop string or token id that ended it


class OutputProcessor:
    def __init__(self, tokenizer: TokenizerBase, max_model_len: int, device: torch.device) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.device = device

    def start(self, seq: Sequence) -> tuple[IncrementalDecoder, torch.Generator | None, ChoiceGuide | None]:
        """What a new sampled sequence decodes with: its detokenizer, its seeded generator (None: unseeded) and the
        guide of its guided choice (None: none)."""
        params = seq.params
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(params.seed + seq.index)
        detokenizer = IncrementalDecoder(
            self.tokenizer,
            skip_special_tokens=params.skip_special_tokens,
            stop=params.stop,
            min_tokens=params.min_tokens,
            prompt_token_ids=seq.prompt,
        )
        guide = None if params.guided_choice is None else ChoiceGuide.of(self.tokenizer, params.guided_choice)
        return detokenizer, generator, guide

    def suppressed(self, seq: Sequence, unread: int = 0) -> list[int] | None:
        """Below min_tokens, the tokens that would end the sequence may not be drawn. `unread`: tokens it sampled
        in the step in flight, not appended yet (a plan that continues it): they are generated."""
        if len(seq.output) + unread >= seq.params.min_tokens:
            return None
        eos = [] if seq.params.ignore_eos else self.tokenizer.eos_token_ids
        return list(eos) + list(seq.params.stop_token_ids)

    @staticmethod
    def allowed(seq: Sequence) -> list[int] | None:
        """The only tokens a guided sequence may draw next (None: any). Its tokens are read before its next step
        is planned (Scheduler.can_continue), so the output is whole."""
        if seq.guide is None:
            return None
        return seq.guide.allowed(seq.output, seq.params.ignore_eos)

    def new_token(self, seq: Sequence, result: SampleResult, i: int) -> NewToken:
        """What row i of the sampled result adds to the sequence, and whether it ends it. Feeds the token to the
        sequence's detokenizer: called once per token, in order, by Scheduler.update only, which applies it."""
        token = result.ids[i]
        first = None
        if not seq.output and seq.params.first_token_logprobs and result.full_logprobs is not None:
            first = result.full_logprobs[i].clone()  # a copy: the row must not hold the whole batch's
        entry = None
        if result.logprobs is not None and seq.params.logprobs is not None:
            entry = {token: float(result.logprobs[i])}
            if result.top_logprobs is not None:
                for t, lp in result.top_logprobs[i]:
                    entry.setdefault(int(t), float(lp))
        text = seq.detokenizer.feed(token)
        return NewToken(token, text, entry, first, *self._stop(seq, token))

    def _stop(self, seq: Sequence, token: int) -> tuple[str | None, str | int | None]:
        """(finish reason, stop reason) if `token`, appended, ends the sequence; (None, None) if not."""
        p = seq.params
        n = len(seq.output) + 1  # with the token
        if n >= p.min_tokens:
            if not p.ignore_eos and token in self.tokenizer.eos_token_ids:
                return "stop", None
            if token in p.stop_token_ids:
                return "stop", token
            if seq.detokenizer.stopped is not None:
                return "stop", seq.detokenizer.stopped
            if seq.guide is not None and seq.guide.ends([*seq.output, token]):
                return "stop", None
        if n >= p.max_tokens or seq.total_len + 1 >= self.max_model_len:
            return "length", None
        return None, None

    @staticmethod
    def output(
        request_id: str, prompt: RenderedPrompt, seqs: list[Sequence], error: str | None = None
    ) -> RequestOutput:
        outs = []
        for seq in seqs:
            # seq.text only grows by what the detokenizer released: streamed text never retracts.
            logprobs = list(seq.logprobs) if seq.params is not None and seq.params.logprobs is not None else None
            outs.append(
                CompletionOutput(
                    seq.index,
                    seq.text,
                    list(seq.output),
                    seq.finish_reason,
                    seq.stop_reason,
                    logprobs,
                    seq.first_token_logprobs,
                )
            )
        m = seqs[0].metrics
        end = max((s.metrics.finished or 0.0) for s in seqs) or None
        metrics = RequestMetrics(
            arrival=m.arrival,
            queue_time=m.queue_time,
            ttft=min((s.metrics.ttft for s in seqs if s.metrics.ttft is not None), default=None),
            decode_time=m.decode_time,
            e2e=None if end is None or not all(s.is_finished for s in seqs) else end - m.arrival,
            cached_tokens=sum(s.metrics.cached_tokens for s in seqs),
            prefilled_tokens=sum(s.metrics.prefilled_tokens for s in seqs),
        )
        # seqs[0].segments are the prompt's (engine/intake.py): their length is summed once per sequence
        return RequestOutput(request_id, list(prompt.final), seqs[0].context_len, outs, metrics, error)
