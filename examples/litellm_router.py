"""A LiteLLM Router whose deployments quotaengine chooses: two lines (SPEC 20).

    python examples/litellm_router.py [BASE_URL] [DB]

Three deployments of one model group, two "Groq" keys and a local server that takes
two requests at once, all speaking the OpenAI API at BASE_URL (default: the test
suite's local server address). Nothing is declared for the local server: its first
concurrency 429 teaches the engine its cap, and from then on requests wait for a free
slot (``wait_s``) instead of being refused. Sync, async and streamed calls all end
their leases exactly once, through LiteLLM's own callbacks.
"""

from __future__ import annotations

import asyncio
import sys

import litellm
import quotaengine as qe
import quotaengine.litellm as qel

BASE = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/v1"
DB = sys.argv[2] if len(sys.argv) > 2 else "quota.db"


def deployment(dep_id: str, model: str, platform: str, key_id: int, **limits: int) -> dict[str, object]:
    return {
        "model_name": "llama",
        "litellm_params": {"model": f"openai/{model}", "api_base": BASE, "api_key": f"sk-{dep_id}", **limits},
        # The route of a deployment on a local address: said here (hosted providers'
        # routes are derived from their api_base).
        "model_info": {"id": dep_id, "quotaengine": {"platform": platform, "key_id": key_id}},
    }


router = litellm.Router(
    model_list=[
        deployment("groq-1", "ok", "groq", 1, rpm=30, tpm=6_000),
        deployment("groq-2", "ok", "groq", 2, rpm=30, tpm=6_000),
        deployment("local", "busy", "local", 3),
    ],
    num_retries=2,
)
engine = qe.QuotaEngine(DB)
plugin = qel.install(router, engine, wait_s=5)  # <- the two lines

MESSAGES = [{"role": "user", "content": "hi"}]
reply = router.completion(model="llama", messages=MESSAGES, max_tokens=50)
print("sync:", reply.usage.total_tokens, "tokens")

stream = router.completion(model="llama", messages=MESSAGES, stream=True, stream_options={"include_usage": True})
print("stream:", "".join(c.choices[0].delta.content or "" for c in stream if c.choices))


async def main() -> None:
    replies = await asyncio.gather(*(router.acompletion(model="llama", messages=MESSAGES) for _ in range(12)))
    print("async:", len(replies), "served")


asyncio.run(main())
for dep_id in ("groq-1", "groq-2", "local"):
    route = plugin.route_of(dep_id)
    print(dep_id, route, "requests:", engine.usage(*route)["rpm"]["used"], "cap:", engine.key_concurrency_cap(*route[::2]))
plugin.uninstall()
engine.close()
