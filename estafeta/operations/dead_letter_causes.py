"""The cause of a dead letter, as grouping sees it: the step, the error type and its normalised message.

Apart from the dead letters themselves: the console's charts and lists name a letter's
cause from its stored reason alone, and the parsing of the reasons the steps write is
one concept of its own.
"""

from __future__ import annotations

import hashlib
import re

import attrs

_FAILED = re.compile(r"^failed \d+ times, last: ([A-Za-z_][\w.]*): (.*)$", re.DOTALL)
_NORMALISE = [
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE), "<uuid>"),
    (re.compile(r"'[^']*'|\"[^\"]*\""), "<str>"),
    (re.compile(r"\b0x[0-9a-f]+\b|\b[0-9a-f]{16,}\b", re.IGNORECASE), "<hex>"),
    (re.compile(r"\d+(\.\d+)?"), "<n>"),
    (re.compile(r"\s+"), " "),
]


def normalise(text: str) -> str:
    """``text`` with what differs between occurrences of one cause (ids, numbers, quoted values) blanked out."""
    for pattern, replacement in _NORMALISE:
        text = pattern.sub(replacement, text)
    return text.strip()[:300]


@attrs.frozen
class Cause:
    """Why a dead letter was parked, as grouping sees it."""

    #: The step that refused the message.
    actor: str
    #: The error's type (``LookupError``, ``BusinessFailure``, ``InvalidMessage``, ``KilledItsWorker``...).
    error: str
    #: The error's message, normalised.
    pattern: str

    @property
    def group(self) -> str:
        """A short stable id of the cause: ``estafeta dead-letters replay --group`` takes it."""
        return hashlib.sha1(f"{self.actor}\0{self.error}\0{self.pattern}".encode()).hexdigest()[:10]


def cause_of(consumer: str, reason: str) -> Cause:
    """The cause of a dead letter parked by ``consumer`` with ``reason`` (as the steps write it)."""
    text = reason.removeprefix(f"{consumer}: ")
    failed = _FAILED.match(text)
    if failed:
        return Cause(consumer, failed.group(1), normalise(failed.group(2)))
    if text.startswith("business failure: "):
        return Cause(consumer, "BusinessFailure", normalise(text.removeprefix("business failure: ")))
    if "without finishing" in text or text.startswith("killed its worker"):
        return Cause(consumer, "KilledItsWorker", normalise(text))
    return Cause(consumer, "InvalidMessage", normalise(text))
