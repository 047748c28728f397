"""Error bodies as real providers send them, for the tests of SPEC 15 (and 6.2, 7).

The bodies themselves are the package's corpus, ``quotaengine/_bodies/<provider>/``
(one copy, read also by the demo and the Rust core's tests); this module names them
for the tests. Wordings are the providers' own: Google's RPC error JSON with its
QuotaFailure, RetryInfo and Help details; Groq's and OpenAI's rate-limit messages with
their stated delays (and Groq's upsell, which names "today" but is a per-minute limit);
Ollama's answer when its request queue is full."""

from __future__ import annotations

import json

from quotaengine._bodies import read

# Gemini's 429 RESOURCE_EXHAUSTED for a spent daily quota, with RetryInfo's 17 s.
GEMINI_PER_DAY_17S = read("google", "per_day_17s.json")


def gemini_body(quota_id: str, retry_delay: str | None, quota_value: str = "200") -> str:
    """Gemini's 429 RESOURCE_EXHAUSTED: which quota (the CamelCase id), its value, and
    RetryInfo's `retryDelay` when given."""
    body = json.loads(GEMINI_PER_DAY_17S)
    details = body["error"]["details"]
    violation = details[0]["violations"][0]
    violation["quotaId"] = quota_id
    violation["quotaValue"] = quota_value
    if retry_delay:
        details[-1]["retryDelay"] = retry_delay
    else:
        del details[-1]
    return json.dumps(body)


GEMINI_PER_MINUTE_17S = gemini_body("GenerateRequestsPerMinutePerProjectPerModel-FreeTier", "17s")

GROQ_TPM_766 = read("groq", "tpm_429.json")

OPENAI_TPM_20MS = read("openai", "tpm_20ms.json")

# Ollama's scheduler when its queue is full (OLLAMA_MAX_QUEUE), with HTTP 503.
OLLAMA_BUSY = read("ollama", "busy_503.json")

# OpenRouter (SPEC 21). A free model's upstream congested for every key: the wording
# and shape reported in github.com/Aculeasis/openrouter-proxy/issues/1 (2025-07-21).
OPENROUTER_UPSTREAM = read("openrouter", "upstream_429.json")
# The same error as LiteLLM passes it on (its exception's message prefixes the body).
OPENROUTER_UPSTREAM_LITELLM = "litellm.RateLimitError: RateLimitError: OpenrouterException - " + OPENROUTER_UPSTREAM
# A 402 whose metadata names no upstream (github.com/astrio-labs/forall/issues/76).
OPENROUTER_402 = read("openrouter", "credits_402.json")

# OpenRouter's 429 for its account-wide free pools: the message names the pool
# (`free-models-per-min`, `free-models-per-day`) and `error.metadata.headers` carries
# X-RateLimit-Limit, -Remaining and -Reset (epoch ms). Shape and wording as reported in
# github.com/Gitlawb/openclaude/issues/936 (free-models-per-day, Limit 50, Remaining 0,
# the "Add 10 credits" upsell) and github.com/Aider-AI/aider/issues/3936.
OPENROUTER_PER_DAY = read("openrouter", "free_per_day_429.json")
OPENROUTER_PER_DAY_UPSELL = "Add 10 credits to unlock 1000 free model requests per day"


def openrouter_pool_body(pool: str, limit: int, reset_ms: int, upsell: str = "") -> str:
    """OpenRouter's 429 for an account-wide free pool (`OPENROUTER_PER_DAY`'s shape):
    which pool, its limit, its reset and the upsell after the pool's name."""
    body = json.loads(OPENROUTER_PER_DAY)
    body["error"]["message"] = f"Rate limit exceeded: {pool}. {upsell}"
    headers = body["error"]["metadata"]["headers"]
    headers["X-RateLimit-Limit"] = str(limit)
    headers["X-RateLimit-Reset"] = str(reset_ms)
    return json.dumps(body, separators=(",", ":"))
