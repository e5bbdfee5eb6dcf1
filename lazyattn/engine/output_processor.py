"""After sampling: append each token, detokenise incrementally, decide whether the sequence stops, and build the
outputs that `generate` returns and the server streams."""

from __future__ import annotations

import time

import torch

from lazyattn.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from lazyattn.engine.prompt import RenderedPrompt
from lazyattn.engine.sampling import SampleResult
from lazyattn.engine.sequence import Sequence
from lazyattn.model.detokenizer import IncrementalDecoder
from lazyattn.model.tokenizer import TokenizerBase


class OutputProcessor:
    def __init__(self, tokenizer: TokenizerBase, max_model_len: int, device: torch.device) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.device = device

    def start(self, seq: Sequence) -> None:
        """Per-sequence state a sampled sequence needs: its detokenizer and its seeded generator."""
        params = seq.params
        if params.seed is not None:
            seq.generator = torch.Generator(device=self.device).manual_seed(params.seed + seq.index)
        seq.detokenizer = IncrementalDecoder(
            self.tokenizer,
            skip_special_tokens=params.skip_special_tokens,
            stop=params.stop,
            min_tokens=params.min_tokens,
            prompt_token_ids=seq.prompt,
        )

    def suppressed(self, seq: Sequence, unread: int = 0) -> list[int] | None:
        """Below min_tokens, the tokens that would end the sequence may not be drawn. `unread`: tokens it sampled
        in the step in flight, not appended yet (a plan that continues it): they are generated."""
        if len(seq.output) + unread >= seq.params.min_tokens:
            return None
        eos = [] if seq.params.ignore_eos else self.tokenizer.eos_token_ids
        return list(eos) + list(seq.params.stop_token_ids)

    def append(self, seq: Sequence, result: SampleResult, i: int, now: float) -> bool:
        """Append row i of the sampled result to the sequence's outputs (its run has it from the scheduler, whose
        update calls this); returns whether the sequence is done."""
        token = result.ids[i]
        if not seq.output and seq.params.first_token_logprobs and result.full_logprobs is not None:
            seq.first_token_logprobs = result.full_logprobs[
                i
            ].clone()  # a copy: the row must not hold the whole batch's
        seq.output.append(token)
        if result.logprobs is not None and seq.params.logprobs is not None:
            entry = {token: float(result.logprobs[i])}
            if result.top_logprobs is not None:
                for t, lp in result.top_logprobs[i]:
                    entry.setdefault(int(t), float(lp))
            seq.logprobs.append(entry)
        if seq.metrics.first_token is None:
            seq.metrics.first_token = now
        seq.text += seq.detokenizer.feed(token)
        return self._stop_reason(seq, token) is not None

    def finish(self, seq: Sequence, reason: str | None = None) -> None:
        if reason is not None:
            seq.finish_reason = reason
        if seq.detokenizer is not None:
            seq.text += seq.detokenizer.finish()  # the held-back tail, now final
        seq.metrics.finished = time.monotonic()

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        p = seq.params
        n = len(seq.output)
        if n >= p.min_tokens:
            if not p.ignore_eos and token in self.tokenizer.eos_token_ids:
                seq.finish_reason = "stop"
                return seq.finish_reason
            if token in p.stop_token_ids:
                seq.finish_reason, seq.stop_reason = "stop", token
                return seq.finish_reason
            if seq.detokenizer.stopped is not None:
                seq.finish_reason, seq.stop_reason = "stop", seq.detokenizer.stopped
                return seq.finish_reason
        if n >= p.max_tokens or seq.total_len >= self.max_model_len:
            seq.finish_reason = "length"
            return seq.finish_reason
        return None

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
