"""Schemathesis hooks for the order API (``SCHEMATHESIS_HOOKS=tests.schemathesis_hooks``).

A valid Idempotency-Key that schemathesis draws is replaced by a fresh UUID (in the same
form, quoted or bare) before the call: a stateless fuzzer reuses values, and a reused key
with another body is rightly a 422, which its "valid data is accepted" check would count
as a failure. Malformed keys are sent as drawn. Replays are the HTTP tests' business.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import schemathesis

from estafeta_console.server.web import KEY_PATTERN

_KEY = re.compile(KEY_PATTERN)


@schemathesis.hook
def before_call(context: Any, case: Any, **kwargs: Any) -> None:
    """Give every call with a valid key a key of its own."""
    headers = case.headers or {}
    key = headers.get("Idempotency-Key")
    if isinstance(key, str) and _KEY.fullmatch(key):
        fresh = str(uuid.uuid4())
        headers["Idempotency-Key"] = f'"{fresh}"' if key.startswith('"') else fresh
        case.headers = headers
