"""A router in one screen: two providers, several free-tier keys each, one engine.

    python examples/router.py [BASE_URL] [DB]

Each request goes through ``engine.lease_any`` (the route with the most room, leased in
one atomic step, waiting up to 5 s when all are full) and every answer, success or
error, through ``lease.observe`` (tokens, rate-limit headers, cooldowns, learned
limits). The SDK clients have ``max_retries=0``: the engine decides where a retry goes.
Both providers speak the OpenAI API; BASE_URL (default: the test suite's local server
address) stands in for their endpoints.
"""

from __future__ import annotations

import sys

import openai
import quotaengine as qe

BASE = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
DB = sys.argv[2] if len(sys.argv) > 2 else "quota.db"

# platform -> (endpoint, model, {key_id: API key}); one of Groq's keys has spent its quota
PROVIDERS = {
    "groq": (f"{BASE}/v1", "llama-3.3-70b-versatile", {1: "gsk-exhausted", 2: "gsk-two"}),
    "cerebras": (f"{BASE}/v1", "llama3.1-8b", {3: "csk-three", 4: "csk-four"}),
}
LIMITS = {"groq": {"rpm": 30, "rpd": 1_000}, "cerebras": {"rpm": 30, "tpd": 1_000_000}}

engine = qe.QuotaEngine(DB)
clients: dict[int, openai.OpenAI] = {}
routes: list[tuple[str, str, int]] = []
for platform, (url, model, keys) in PROVIDERS.items():
    engine.set_model_limits(platform, model, **LIMITS[platform])
    for key_id, api_key in keys.items():
        engine.register_key(key_id, platform)
        clients[key_id] = openai.OpenAI(api_key=api_key, base_url=url, max_retries=0)
        routes.append((platform, model, key_id))


def ask(prompt: str) -> str | None:
    for _attempt in range(len(routes)):  # a refused dispatch benches its route: try another
        with engine.lease_any(routes, estimated_tokens=200, wait_s=5) as lease:
            client = clients[lease.key_id]
            try:
                raw = client.chat.completions.with_raw_response.create(
                    model=lease.model_id, messages=[{"role": "user", "content": prompt}]
                )
            except openai.APIError as exc:
                outcome = lease.observe(exc)
                print(f"  {lease.platform} key {lease.key_id}: {outcome.kind if outcome else exc}")
                continue
            lease.observe(raw)
            return raw.parse().choices[0].message.content
    return None


prompts = [f"question {i}" for i in range(6)]
answers = [ask(p) for p in prompts]
served = sum(a is not None for a in answers)
print(f"served {served} of {len(prompts)}")
for c in engine.active_cooldowns():
    print(f"  benched: {c.platform} key {c.key_id} for {c.remaining_ms / 1000:.0f} s ({c.source})")
engine.close()
