"""Sampling parameters and the batched sampler.

Field names follow vLLM's SamplingParams. Logprobs are those of the model's own distribution (log_softmax of
the raw logits, before temperature or truncation), which is vLLM's default.

Reproducibility: a row with its own `torch.Generator` (seeded request) draws exactly `vocab_size` exponentials
from it per step and nothing else, so the same seed and the same logits give the same token whatever else is
in the batch. Rows without a generator share one batched draw from the global generator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch

from lazyattn.errors import InvalidRequestError

MAX_LOGPROBS = 20  # OpenAI's limit for top_logprobs
# Seeds are signed 64-bit, as in OpenAI's and vLLM's APIs; sample i of a request is seeded with seed + i, which
# stays within what torch.Generator.manual_seed takes (-2**63 .. 2**64 - 1) for any n.
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
# Stop strings are searched in the output after every token (and their prefixes held back while streaming), so
# their number and length bound the work a request adds to every step of the batch it is in.
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 128
MAX_STOP_TOKEN_IDS = 256
# A guided choice's strings are tokenized for every sequence and walked as a prefix tree at every step.
MAX_GUIDED_CHOICES = 256
MAX_GUIDED_CHOICE_CHARS = 256
# Temperatures below this are greedy: dividing logits by ~0 overflows, and the result would be argmax anyway.
_GREEDY_EPS = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """Per-request generation settings; `validate` checks them against a vocabulary."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0  # in (0, 1]; the likeliest token is always kept, so a tiny top_p is greedy
    top_k: int = -1  # -1 or 0: off
    min_p: float = 0.0  # 0: off; else drop tokens with prob < min_p * (top token's prob)
    seed: int | None = None
    stop: Sequence[str] = ()
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    n: int = 1
    logprobs: int | None = None  # None: no logprobs; k: the chosen token's plus the top k
    # EOS and stop_token_ids are suppressed until this many tokens exist (above max_tokens: through the end)
    min_tokens: int = 0
    skip_special_tokens: bool = True
    # The whole log-softmax row (fp32, every token of the vocabulary) of the first generated token's distribution,
    # returned as CompletionOutput.first_token_logprobs: what `lazyattn eval --fidelity` compares between dtypes,
    # batch sizes and modes. It takes the sampler off the fused greedy path for the request's steps.
    first_token_logprobs: bool = False
    # The output is one of these strings, each produced as its own tokenization (engine/guided.py); None: free.
    guided_choice: Sequence[str] | None = None

    def __post_init__(self) -> None:
        # Accept a single stop string (OpenAI allows it) and any sequence; store tuples so params stay hashable.
        # Anything else is left as given for validate() to reject with a message.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif isinstance(self.stop, list):
            object.__setattr__(self, "stop", tuple(self.stop))
        if isinstance(self.stop_token_ids, list):
            object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if isinstance(self.guided_choice, list):
            object.__setattr__(self, "guided_choice", tuple(self.guided_choice))

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS or self.top_k == 1

    def validate(self, vocab_size: int) -> None:
        """Raise InvalidRequestError, naming the field, for any value out of range. Every value that passes
        is one the sampler computes with: a request can only fail itself, never the batch it joins."""
        _int("n", self.n, low=1)
        _int("max_tokens", self.max_tokens, low=1)
        _int("min_tokens", self.min_tokens, low=0)
        _float("temperature", self.temperature, low=0.0)
        _float("top_p", self.top_p, low=0.0, high=1.0)
        if self.top_p <= 0.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}", param="top_p")
        _int("top_k", self.top_k, low=-1, high=vocab_size)
        _float("min_p", self.min_p, low=0.0, high=1.0)
        if self.seed is not None:
            _int("seed", self.seed, low=SEED_MIN, high=SEED_MAX)
        if self.logprobs is not None:
            _int("logprobs", self.logprobs, low=0, high=MAX_LOGPROBS)
        for name in ("ignore_eos", "skip_special_tokens", "first_token_logprobs"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidRequestError(f"{name} must be true or false", param=name)
        if not isinstance(self.stop, tuple):
            raise InvalidRequestError("stop must be a string or a list of strings", param="stop")
        if not isinstance(self.stop_token_ids, tuple):
            raise InvalidRequestError("stop_token_ids must be a list of token ids", param="stop_token_ids")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidRequestError(
                f"stop has {len(self.stop)} strings; at most {MAX_STOP_STRINGS} are allowed", param="stop"
            )
        for s in self.stop:
            if not isinstance(s, str) or not s or len(s) > MAX_STOP_CHARS:
                shown = f"{s[:20]!r}... ({len(s)} characters)" if isinstance(s, str) and len(s) > 20 else repr(s)
                raise InvalidRequestError(
                    f"stop must be strings of 1 to {MAX_STOP_CHARS} characters, got {shown}", param="stop"
                )
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise InvalidRequestError(
                f"stop_token_ids has {len(self.stop_token_ids)} ids; at most {MAX_STOP_TOKEN_IDS} are allowed",
                param="stop_token_ids",
            )
        for t in self.stop_token_ids:
            _int("stop_token_ids", t, low=0, high=vocab_size - 1)
        self._validate_guided_choice()

    def _validate_guided_choice(self) -> None:
        choices = self.guided_choice
        if choices is None:
            return
        if not isinstance(choices, tuple) or not 1 <= len(choices) <= MAX_GUIDED_CHOICES:
            raise InvalidRequestError(
                f"guided_choice must be a list of 1 to {MAX_GUIDED_CHOICES} strings", param="guided_choice"
            )
        for c in choices:
            if not isinstance(c, str) or not c or len(c) > MAX_GUIDED_CHOICE_CHARS:
                raise InvalidRequestError(
                    f"guided_choice must be strings of 1 to {MAX_GUIDED_CHOICE_CHARS} characters, got {c!r:.40}",
                    param="guided_choice",
                )
        if self.min_tokens:  # a choice that ends the sequence could be shorter than min_tokens
            raise InvalidRequestError("guided_choice does not take min_tokens: a choice ends its answer", "min_tokens")


def _int(name: str, value: object, low: int | None = None, high: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidRequestError(f"{name} must be an integer, got {value!r}", param=name)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise InvalidRequestError(f"{name} must be {bounds}, got {value}", param=name)


def _float(name: str, value: object, low: float, high: float | None = None) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise InvalidRequestError(f"{name} must be a finite number, got {value!r}", param=name)
    if value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise InvalidRequestError(f"{name} must be {bounds}, got {value}", param=name)


@dataclass
class SampleResult:
    token_ids: torch.Tensor  # [B] int64
    logprobs: torch.Tensor  # [B] fp32, log p(chosen token) under the raw logits
    # The top k logprobs of every row ([B, k], best first; k the most any row asked for) and how many each row
    # asked for (None: none). Kept as tensors so that sampling never waits for the device (engine/step_pipeline.py).
    top_values: torch.Tensor | None = None
    top_ids: torch.Tensor | None = None
    top_counts: list[int | None] = field(default_factory=list)
    # Every row's whole log-softmax row [B, V], only when some row's params ask for first_token_logprobs.
    full_logprobs: torch.Tensor | None = None

    @cached_property
    def ids(self) -> list[int]:
        """token_ids as a list, made once per result: one conversion, where an index and int() per row each cost
        host time (docs/benchmarks.md, "Kernel constants")."""
        return self.token_ids.tolist()

    @cached_property
    def non_finite_rows(self) -> set[int]:
        """Rows whose logits are not a distribution: a NaN, a +inf, or every entry -inf (KV gone bad, say). The
        chosen token's logprob is NaN exactly for those, on every path (log_softmax; the greedy kernel), so the
        check costs no launch of its own and comes back with the ids."""
        return set(torch.isnan(self.logprobs).nonzero().flatten().tolist())

    @cached_property
    def top_logprobs(self) -> list[list[tuple[int, float]] | None] | None:
        """Per row: (token id, logprob) best first, as many as the row asked for; None for rows that did not ask."""
        if self.top_values is None:
            return None
        values, ids = self.top_values.tolist(), self.top_ids.tolist()
        return [
            None if k is None else list(zip(ids[row][:k], values[row][:k])) for row, k in enumerate(self.top_counts)
        ]

    def to_host(self) -> SampleResult:
        """The same result in host memory, its copies queued behind the sampling (pinned memory on CUDA: they do
        not block the host); read it once the device has passed them (an event recorded after this call)."""

        def host(t: torch.Tensor | None) -> torch.Tensor | None:
            if t is None or t.device.type == "cpu":
                return t
            return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)

        return SampleResult(
            host(self.token_ids),
            host(self.logprobs),
            host(self.top_values),
            host(self.top_ids),
            self.top_counts,
            host(self.full_logprobs),
        )


def _on(device: torch.device, values: list) -> torch.Tensor:
    """A small tensor of per-row values on the device, without waiting for it: through pinned memory on CUDA (a
    copy from pageable memory would wait for the step queued before it, undoing overlapped scheduling)."""
    t = torch.tensor(values)
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t


def _pairs(device: torch.device, lists: Sequence[Sequence[int] | None]) -> tuple[torch.Tensor, torch.Tensor]:
    """The (row, token) index pairs of every token in `lists` (row i's tokens; None or empty: none), on the device."""
    rows = [row for row, ids in enumerate(lists) if ids for _ in ids]
    tokens = [t for ids in lists if ids for t in ids]
    return _on(device, rows).long(), _on(device, tokens).long()


class Sampler:
    """Picks the next token of every row of a batch of logits, each row under its own SamplingParams.

    Every step is per row (log_softmax, argmax, the truncations, a seeded row's own generator), so a row's token and
    logprob do not depend on its neighbours, except for one shortcut: an all-greedy batch on CUDA takes the greedy
    kernel (kernels/greedy.py), whose log Σ exp is summed in another order than log_softmax's. `deterministic`
    (docs/design.md, "Deterministic mode") turns it off, so that a row's logprob never depends on whether a
    neighbour asked for logprobs or samples."""

    def __init__(self, deterministic: bool = False) -> None:
        self.deterministic = deterministic

    def sample(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator | None],
        suppress_token_ids: Sequence[Sequence[int]] | None = None,
        allowed_token_ids: Sequence[Sequence[int] | None] | None = None,
    ) -> SampleResult:
        """`logits` [B, V]. `suppress_token_ids[i]` can never be chosen by row i (the engine passes EOS and
        stop_token_ids while a sequence is shorter than min_tokens); `allowed_token_ids[i]`, where not None, are the
        only tokens row i may choose (a guided choice, engine/guided.py). Neither changes the logprobs."""
        batch, vocab = logits.shape
        if len(params) != batch or len(generators) != batch:
            raise ValueError(f"{batch} rows of logits but {len(params)} params and {len(generators)} generators")
        suppressing = suppress_token_ids is not None and any(suppress_token_ids)
        guiding = allowed_token_ids is not None and any(a is not None for a in allowed_token_ids)
        if (
            logits.is_cuda
            and not self.deterministic
            and all(p.greedy and p.logprobs is None and not p.first_token_logprobs for p in params)
            and not suppressing
            and not guiding
        ):
            from lazyattn.kernels.greedy import greedy_pick  # Triton is imported only where CUDA runs

            rows = logits if logits.stride(-1) == 1 else logits.contiguous()
            return SampleResult(*greedy_pick(rows))  # the same two numbers a row, in two launches
        logits = logits.float()
        logprobs_all = torch.log_softmax(logits, dim=-1)
        if suppressing or guiding:
            logits = self._constrained(logits, suppress_token_ids if suppressing else None, allowed_token_ids)

        token_ids = logits.argmax(dim=-1)
        random_rows = [i for i, p in enumerate(params) if not p.greedy]
        if random_rows:
            rows = _on(logits.device, random_rows)
            probs = self._truncated_probs(logits[rows], [params[i] for i in random_rows])
            token_ids[rows] = self._draw(probs, [generators[i] for i in random_rows])

        chosen = logprobs_all.gather(1, token_ids[:, None]).squeeze(1)
        full = logprobs_all if any(p.first_token_logprobs for p in params) else None
        if all(p.logprobs is None for p in params):
            return SampleResult(token_ids, chosen, full_logprobs=full)
        k = min(max(p.logprobs or 0 for p in params), vocab)
        values, ids = logprobs_all.topk(k, dim=-1)
        return SampleResult(token_ids, chosen, values, ids, [p.logprobs for p in params], full)

    @staticmethod
    def _constrained(
        logits: torch.Tensor,
        suppress: Sequence[Sequence[int] | None] | None,
        allowed: Sequence[Sequence[int] | None] | None,
    ) -> torch.Tensor:
        """A copy of `logits` with row i's suppressed tokens at -inf and, where it has an allowed list, every other
        token too. Only (row, token) pairs cross to the device, never a vocabulary-wide mask per row."""
        device = logits.device
        out = logits.clone()
        if suppress is not None:
            out[_pairs(device, suppress)] = float("-inf")
        guided = [i for i, ids in enumerate(allowed or ()) if ids is not None]
        if guided:
            keep = torch.zeros(len(guided), logits.shape[-1], dtype=torch.bool, device=device)
            keep[_pairs(device, [allowed[i] for i in guided])] = True
            index = _on(device, guided)
            out[index] = out[index].masked_fill(~keep, float("-inf"))
        return out

    @staticmethod
    def _truncated_probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
        """Softmax(logits / T) with top-k, then top-p (on what top-k kept), then min-p applied; zero elsewhere."""
        device, vocab = logits.device, logits.shape[-1]
        temperature = _on(device, [p.temperature for p in params])
        logits = logits / temperature[:, None]
        # Clamped as well as validated: an id tensor cannot hold an arbitrary Python int, and a k beyond the
        # vocabulary keeps every token anyway.
        top_k = [min(p.top_k, vocab) if p.top_k > 0 else vocab for p in params]
        needs_sort = any(k < vocab for k in top_k) or any(p.top_p < 1.0 for p in params)
        if needs_sort:
            # One descending sort serves both truncations: top-k is a rank cut, top-p a cumulative-mass cut.
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            ranks = torch.arange(vocab, device=device)
            k = _on(device, top_k)
            sorted_logits = sorted_logits.masked_fill(ranks[None, :] >= k[:, None], float("-inf"))
            sorted_probs = sorted_logits.softmax(dim=-1)
            top_p = _on(device, [p.top_p for p in params])
            # Keep a token while the mass strictly before it is < top_p: the smallest set reaching top_p. The top
            # token is kept whatever top_p is: a top_p below float32's smallest value (~1e-45) is 0 here, which
            # would drop every token. Rows with top_p = 1 keep all (guards cumsum rounding above 1).
            mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
            drop = (mass_before >= top_p[:, None]) & (top_p[:, None] < 1.0) & (ranks[None, :] > 0)
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            logits = torch.full_like(logits, float("-inf")).scatter(1, order, sorted_logits)
        probs = logits.softmax(dim=-1)
        if any(p.min_p > 0 for p in params):
            min_p = _on(device, [p.min_p for p in params])
            floor = probs.amax(dim=-1, keepdim=True) * min_p[:, None]
            probs = probs.masked_fill(probs < floor, 0.0)
        return probs

    @staticmethod
    def _draw(probs: torch.Tensor, generators: Sequence[torch.Generator | None]) -> torch.Tensor:
        """Categorical draw by exponential race: argmax p_i / E_i with E_i ~ Exp(1) picks i with probability
        proportional to p_i. Unlike torch.multinomial it needs no normalisation and batches over rows."""
        noise = torch.empty_like(probs)
        shared = [i for i, g in enumerate(generators) if g is None]
        if shared:
            draw = torch.empty(len(shared), probs.shape[-1], device=probs.device).exponential_()
            noise[_on(probs.device, shared)] = draw
        for i, g in enumerate(generators):
            if g is not None:
                noise[i].exponential_(generator=g)
        # Exp(1) can return exactly 0; keep the ratio finite (0/0 would be NaN and poison argmax).
        return (probs / noise.clamp_min_(torch.finfo(noise.dtype).tiny)).argmax(dim=-1)
