"""Loaded by the schemathesis run of test_openapi.py (SCHEMATHESIS_HOOKS): the built-in "schema-valid requests
are accepted" check, less five cases where a 400 for a schema-valid-looking request is right.

- No JSON schema can say that a prompt and max_tokens must fit the context window (it depends on the tokens
  of every message and document and on the template), so a schema-valid request may still get that 400. It
  must carry the `context_length_exceeded` code the schema's 400 description names.
- A request's prompts times `n` are sequences, at most the server's `max_request_sequences` (256 by default): the
  schema bounds the prompt list and `n` each, not their product, so a list of prompts with a large `n` may still get
  a 400 naming `n`.
- An answer made of candidate requests (`"answer"`: `"best-document"`, `"best-document-or-joint"` or
  `"confidence-order"`) is one finished answer per prompt: with `n` other than 1 or `stream: true` it is a 400 naming
  that field, and since it asks each prompt once per document, its documents count towards the sequences (a 400
  naming `documents`).
- `confidence_tokens` caps the one-document answers of the two confidence-order strategies only: with any other
  `answer` it is a 400 naming it (the schema cannot tie one field's presence to another's value).
- The seed is a signed 64-bit integer, as OpenAI documents it. Schemathesis compares integers beyond 64 bits
  with the schema's bounds as floats, so 2**63 "equals" 2**63 - 1 to it and looks valid; the server, which
  compares exactly, is right to reject it.
"""

from __future__ import annotations

import schemathesis
from schemathesis.specs.openapi.checks import positive_data_acceptance

from lazyattn.engine.sampling import SEED_MAX, SEED_MIN
from lazyattn.server import ServerConfig

MAX_SEQUENCES = ServerConfig.max_request_sequences  # the test's server keeps the default


def _error(response) -> dict:
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return {}
    return error if isinstance(error, dict) else {}


def _seed_beyond_64_bits(case) -> bool:
    seed = case.body.get("seed") if isinstance(case.body, dict) else None
    return isinstance(seed, int) and not SEED_MIN <= seed <= SEED_MAX


def _too_many_sequences(case) -> bool:
    body = case.body if isinstance(case.body, dict) else {}
    prompt, n = body.get("prompt"), body.get("n")
    prompts = len(prompt) if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else 1
    return isinstance(n, (int, float)) and prompts * n > MAX_SEQUENCES


def _best_document_cannot(case, param: str) -> bool:
    body = case.body if isinstance(case.body, dict) else {}
    return body.get("answer") not in (None, "joint") and param in ("n", "stream", "documents")


def _cap_without_candidates(case) -> bool:
    """confidence_tokens with a joint answer (named, or by default): no candidates to rank, a 400."""
    body = case.body if isinstance(case.body, dict) else {}
    return body.get("confidence_tokens") is not None and body.get("answer") in (None, "joint")


@schemathesis.check
def positive_data_accepted_unless_context_exceeded(ctx, response, case):
    if response.status_code == 400:
        error = _error(response)
        if error.get("code") == "context_length_exceeded":
            return None
        if error.get("param") == "seed" and _seed_beyond_64_bits(case):
            return None
        if error.get("param") == "n" and _too_many_sequences(case):
            return None
        if _best_document_cannot(case, error.get("param")):
            return None
        if error.get("param") == "confidence_tokens" and _cap_without_candidates(case):
            return None
    return positive_data_acceptance(ctx, response, case)
