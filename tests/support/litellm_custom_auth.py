"""LiteLLM's ``general_settings: custom_auth`` for the SPEC 25.2 tests of the real proxy:
authenticated identities without a database. ``VIRTUAL_KEYS`` maps a bearer key to what
the proxy's key table would hold for it; the master key authenticates as LiteLLM's own
master key does (its placeholder user ``default_user_id``, the admin role). Any other
key is refused (401)."""

from __future__ import annotations

import os
from typing import Any

from fastapi import HTTPException, Request
from litellm.proxy._types import LitellmUserRoles, UserAPIKeyAuth

VIRTUAL_KEYS: dict[str, dict[str, str]] = {
    "sk-vk-alpha": {"key_alias": "alpha", "team_id": "red", "org_id": "acme", "user_id": "ann"},
    "sk-vk-beta": {"team_id": "red", "user_id": "ben"},  # no alias: the hashed key names it
}


async def user_api_key_auth(request: Request, api_key: str) -> UserAPIKeyAuth:
    key = api_key.removeprefix("Bearer ").strip()
    if key == os.environ.get("LITELLM_MASTER_KEY"):
        return UserAPIKeyAuth(api_key=key, user_role=LitellmUserRoles.PROXY_ADMIN, user_id="default_user_id")
    fields: dict[str, Any] | None = VIRTUAL_KEYS.get(key)
    if fields is None:
        raise HTTPException(status_code=401, detail="unknown key")
    return UserAPIKeyAuth(api_key=key, **fields)
