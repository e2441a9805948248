"""The console's dead-letter pages: every group, a group's letters a page at a time, and a replay's dry run.

``/console/dead-letters`` lists the groups (parked letters by cause, as ``estafeta
dead-letters groups``); a group's page shows its parked letters, their bodies and reasons,
a page at a time, and what replays did before. With actions allowed, a replay first shows
what it would do (``estafeta dead-letters replay --dry-run``) and asks for a confirmation
naming how many letters it replays (:mod:`estafeta_console.pages.actions` does it).
"""

from __future__ import annotations

from collections import Counter

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from estafeta.operations.dead_letter_replay import replay
from estafeta.operations.dead_letters import groups

from ..data import lists as console_lists
from .kit import PageKit


class LetterPages:
    """The dead-letter pages."""

    def __init__(self, kit: PageKit) -> None:
        self.kit = kit
        self.app = kit.app
        self.runtime = kit.runtime

    def add_routes(self, router: APIRouter) -> None:
        """Route the dead-letter pages on ``router`` (the console's); the replay's dry run with actions only."""
        router.add_api_route("/dead-letters", self.letter_groups, methods=["GET"], response_class=HTMLResponse)
        router.add_api_route("/dead-letters/{service}/{group}", self.letter_group, methods=["GET"])
        if self.kit.allow_actions:
            router.add_api_route("/dead-letters/{service}/{group}/replay", self.replay_preview, methods=["GET"])

    def letter_groups(self) -> HTMLResponse:
        """Every group of parked dead letters, in every service, the largest first."""
        found = groups(self.runtime, self.app.service_names)
        return self.kit.page("console_letter_groups.html", groups=found)

    def letter_group(self, service: str, group: str, before: str | None = None) -> HTMLResponse:
        """A dead-letter group: a page of its parked letters' bodies and reasons, and what replays did before."""
        try:
            found = console_lists.read_letter_group(self.app, self.runtime, service, group, before)
        except console_lists.BadFilter as exc:
            return self.kit.refuse(str(exc))
        if found is None:
            return self.kit.refuse(f"no dead letters in group {group} of {service}", status=404)
        return self.kit.page("console_letters.html", letters=found)

    def replay_preview(
        self, service: str, group: str, notice: str | None = None, sig: str | None = None
    ) -> HTMLResponse:
        """What replaying the group would do, letter by letter counted, and the form that confirms it."""
        if service not in self.app.service_names:
            return self.kit.refuse(f"no service {service!r}")
        would = replay(self.runtime, self.app, [service], group=group, dry_run=True)
        if not would:
            return self.kit.refuse(f"no parked dead letters in group {group} of {service}", status=404)
        outcomes = sorted(Counter(str(done.outcome) for done in would).items())
        reasons = [f"#{done.letter.id}: {done.detail}" for done in would if done.detail][:5]
        return self.kit.page(
            "console_replay.html",
            service=service,
            group=group,
            count=len(would),
            outcomes=outcomes,
            reasons=reasons,
            notice=self.kit.verified(notice, sig),
        )
