"""The console's dead-letter pages: a group's letters, their bodies and reasons, and what replays did before."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from ..data import lists as console_lists
from .kit import PageKit


class LetterPages:
    """The dead-letter pages."""

    def __init__(self, kit: PageKit) -> None:
        self.kit = kit

    def add_routes(self, router: APIRouter) -> None:
        """Route the dead-letter pages on ``router`` (the console's)."""
        router.add_api_route("/dead-letters/{service}/{group}", self.letter_group, methods=["GET"])

    def letter_group(self, service: str, group: str) -> HTMLResponse:
        """A dead-letter group: each parked letter's body and reason, and what replays did before."""
        try:
            found = console_lists.read_letter_group(self.kit.app, self.kit.runtime, service, group)
        except console_lists.BadFilter as exc:
            return self.kit.refuse(str(exc))
        if found is None:
            return self.kit.page(
                "console_missing.html", reason=f"no dead letters in group {group} of {service}", status=404
            )
        return self.kit.page("console_letters.html", letters=found)
