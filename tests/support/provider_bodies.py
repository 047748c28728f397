"""Error bodies as real providers send them, for the tests of SPEC 15 (and 6.2, 7).

Wordings are the providers' own: Google's RPC error JSON with its QuotaFailure,
RetryInfo and Help details; Groq's and OpenAI's rate-limit messages with their
stated delays (and Groq's upsell, which names "today" but is a per-minute limit);
Ollama's answer when its request queue is full."""

from __future__ import annotations


def gemini_body(quota_id: str, retry_delay: str | None, quota_value: str = "200") -> str:
    """Gemini's 429 RESOURCE_EXHAUSTED: which quota (the CamelCase id), its value, and
    RetryInfo's `retryDelay` when given."""
    retry = (
        f', {{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "{retry_delay}"}}'
        if retry_delay
        else ""
    )
    return (
        '{"error": {"code": 429, "message": "You exceeded your current quota, please check your '
        "plan and billing details. For more information on this error, head to: "
        'https://ai.google.dev/gemini-api/docs/rate-limits.", "status": "RESOURCE_EXHAUSTED", '
        '"details": [{"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": '
        '[{"quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests", '
        f'"quotaId": "{quota_id}", "quotaDimensions": {{"location": "global", '
        f'"model": "gemini-2.0-flash"}}, "quotaValue": "{quota_value}"}}]}}, '
        '{"@type": "type.googleapis.com/google.rpc.Help", "links": [{"description": '
        '"Learn more about Gemini API quotas", '
        '"url": "https://ai.google.dev/gemini-api/docs/rate-limits"}]}' + retry + "]}}"
    )


GEMINI_PER_DAY_17S = gemini_body("GenerateRequestsPerDayPerProjectPerModel-FreeTier", "17s")
GEMINI_PER_MINUTE_17S = gemini_body("GenerateRequestsPerMinutePerProjectPerModel-FreeTier", "17s")

GROQ_TPM_766 = (
    '{"error":{"message":"Rate limit reached for model `llama-3.3-70b-versatile` in organization '
    "`org_01jq3xk5ev8rbjs1dq4gxm2cpw` service tier `on_demand` on tokens per minute (TPM): "
    "Limit 6000, Used 5450, Requested 1081. Please try again in 7.66s. Need more tokens? "
    'Upgrade to Dev Tier today at https://console.groq.com/settings/billing",'
    '"type":"tokens","code":"rate_limit_exceeded"}}'
)

OPENAI_TPM_20MS = (
    '{"error": {"message": "Rate limit reached for gpt-4o-mini in organization '
    "org-3Kq9ZPcRz1hW8yL0aBcDeFgH on tokens per min (TPM): Limit 200000, Used 199962, "
    "Requested 59. Please try again in 20ms. Visit https://platform.openai.com/account/rate-limits "
    'to learn more.", "type": "tokens", "param": null, "code": "rate_limit_exceeded"}}'
)

# Ollama's scheduler when its queue is full (OLLAMA_MAX_QUEUE), with HTTP 503.
OLLAMA_BUSY = '{"error":"server busy, please try again.  maximum pending requests exceeded"}'

# OpenRouter (SPEC 21). A free model's upstream congested for every key: the wording
# and shape reported in github.com/Aculeasis/openrouter-proxy/issues/1 (2025-07-21).
OPENROUTER_UPSTREAM = (
    '{"error":{"message":"Provider returned error","code":429,"metadata":{"raw":'
    '"google/gemini-2.0-flash-exp:free is temporarily rate-limited upstream. Please retry '
    "shortly, or add your own key to accumulate your rate limits: "
    'https://openrouter.ai/settings/integrations","provider_name":"Google AI Studio"}}}'
)
# The same error as LiteLLM passes it on (its exception's message prefixes the body).
OPENROUTER_UPSTREAM_LITELLM = "litellm.RateLimitError: RateLimitError: OpenrouterException - " + OPENROUTER_UPSTREAM
# A 402 whose metadata names no upstream (github.com/astrio-labs/forall/issues/76).
OPENROUTER_402 = (
    '{"error":{"message":"This request requires more credits, or fewer max_tokens. You requested '
    "up to 64000 tokens, but can only afford 2666. To increase, visit "
    'https://openrouter.ai/settings/credits and upgrade to a paid account","code":402,'
    '"metadata":{"provider_name":null}},"user_id":"user_35tI40u3gKTMEMGS061Ov1xsUTj"}'
)


def openrouter_pool_body(pool: str, limit: int, reset_ms: int, upsell: str = "") -> str:
    """OpenRouter's 429 for its account-wide free pools: the message names the pool
    (`free-models-per-min`, `free-models-per-day`) and `error.metadata.headers` carries
    X-RateLimit-Limit, -Remaining and -Reset (epoch ms). Shape and wording as reported in
    github.com/Gitlawb/openclaude/issues/936 (free-models-per-day, Limit 50, Remaining 0,
    the "Add 10 credits" upsell) and github.com/Aider-AI/aider/issues/3936."""
    return (
        f'{{"error":{{"message":"Rate limit exceeded: {pool}. {upsell}","code":429,"metadata":'
        f'{{"headers":{{"X-RateLimit-Limit":"{limit}","X-RateLimit-Remaining":"0",'
        f'"X-RateLimit-Reset":"{reset_ms}"}}}}}},"user_id":"user_2zqGkqYQm1"}}'
    )


OPENROUTER_PER_DAY_UPSELL = "Add 10 credits to unlock 1000 free model requests per day"
