"""``estafeta dead-letters``: what the workers refused, grouped by cause, and replaying it once fixed."""

from __future__ import annotations

import json
from typing import Any

import attrs
import click

from estafeta.operations.dead_letter_replay import Replayed, ReplayOutcome, replay
from estafeta.operations.dead_letters import DeadLetter, Group, groups, list_dead_letters, show

from .context import current
from .tables import echo_table, when

_service_option = click.option("--service", "services", multiple=True, help="Only this service (repeatable).")
_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def _services(names: tuple[str, ...]) -> list[str]:
    return current().services(names)


def _json(value: Any) -> str:
    return json.dumps(value, default=str)


def _letter_json(letter: DeadLetter) -> dict[str, Any]:
    return {**attrs.asdict(letter), "group": letter.cause.group, "cause": attrs.asdict(letter.cause)}


def _group_json(group: Group) -> dict[str, Any]:
    return {"group": group.group, "count": group.count, **attrs.asdict(group), "cause": attrs.asdict(group.cause)}


@click.group("dead-letters")
def dead_letters_group() -> None:
    """Messages the workers refused: list them, group them by cause, replay them once the cause is fixed."""


@dead_letters_group.command("list")
@_service_option
@click.option(
    "--status",
    type=click.Choice(["parked", "replayed", "obsolete", "all"]),
    default="parked",
    show_default=True,
    help="Only dead letters in this status.",
)
@click.option("--group", help="Only the parked dead letters of this group (see `groups`).")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="At most this many.")
@_json_option
def list_command(services: tuple[str, ...], status: str, group: str | None, limit: int, as_json: bool) -> None:
    """Dead letters, newest first, with their group and reason."""
    runtime = current().runtime
    found = list_dead_letters(
        runtime, _services(services), status=None if status == "all" else status, group=group, limit=limit
    )
    if as_json:
        click.echo(_json([_letter_json(letter) for letter in found]))
        return
    echo_table(
        ("SERVICE", "ID", "PARKED", "STATUS", "GROUP", "REASON"),
        [(d.service, d.id, when(d.created_at), d.status, d.cause.group, d.reason) for d in found],
        empty="no dead letters",
    )


@dead_letters_group.command("show")
@click.argument("letter_id", type=click.IntRange(min=1))
@_service_option
@_json_option
def show_command(letter_id: int, services: tuple[str, ...], as_json: bool) -> None:
    """One dead letter: its message, reason, cause and what became of it."""
    try:
        letter = show(current().runtime, _services(services), letter_id)
    except LookupError as exc:
        raise click.BadParameter(str(exc), param_hint="LETTER_ID") from None
    if as_json:
        click.echo(_json(_letter_json(letter)))
        return
    cause = letter.cause
    click.echo(f"dead letter {letter.service} #{letter.id}: {letter.status}, parked {when(letter.created_at)}")
    click.echo(f"step {letter.consumer}, message {letter.message_id}")
    click.echo(f"reason: {letter.reason}")
    click.echo(f"group {cause.group}: {cause.error}: {cause.pattern}")
    if letter.status != "parked":
        replayed = f" as {letter.replayed_as}" if letter.replayed_as else ""
        click.echo(
            f"{letter.status}{replayed} at {when(letter.resolved_at)}" + (f": {letter.note}" if letter.note else "")
        )
    click.echo(json.dumps(letter.message, indent=2, default=str))


@dead_letters_group.command("groups")
@_service_option
@_json_option
def groups_command(services: tuple[str, ...], as_json: bool) -> None:
    """Parked dead letters grouped by cause (step, error type, normalised message), the largest group first."""
    found = groups(current().runtime, _services(services))
    if as_json:
        click.echo(_json([_group_json(group) for group in found]))
        return
    echo_table(
        ("GROUP", "COUNT", "STEP", "FIRST", "LAST", "CAUSE"),
        [
            (g.group, g.count, g.cause.actor, when(g.first_at), when(g.last_at), f"{g.cause.error}: {g.cause.pattern}")
            for g in found
        ],
        empty="no parked dead letters",
    )
    if found:
        click.echo("\nonce a cause is fixed: `estafeta dead-letters replay --group GROUP` (try --dry-run first)")


@dead_letters_group.command("replay")
@click.argument("letter_ids", nargs=-1, type=click.IntRange(min=1))
@click.option("--group", help="Every parked dead letter of this group (see `groups`).")
@click.option("--all", "replay_all", is_flag=True, help="Every parked dead letter.")
@click.option("--dry-run", is_flag=True, help="Say what would be done; change nothing.")
@_service_option
@_json_option
def replay_command(
    letter_ids: tuple[int, ...],
    group: str | None,
    replay_all: bool,
    dry_run: bool,
    services: tuple[str, ...],
    as_json: bool,
) -> None:
    """Send dead letters (LETTER_IDS, a --group, or --all) again, once their cause is fixed.

    Each goes through the service's outbox in one transaction with its new status, under
    a new message id (the original is kept as the replay_of option), so the inbox that
    recorded the original does not swallow it. A dead letter is replayed once: replaying
    it again does nothing. A saga command whose saga no longer waits for it is marked
    obsolete instead (to retry a failed saga's step: `estafeta sagas resume`), decided
    under the saga's lock. A letter that cannot be replayed (no step for it, a malformed
    saga reference, an error while writing it) is left parked, its line saying why, and
    the others are replayed; the exit code is then 1.
    """
    if sum((bool(letter_ids), group is not None, replay_all)) != 1:
        raise click.UsageError("give LETTER_IDS, --group GROUP or --all (one of them)")
    context = current()
    names = _services(services)
    try:
        done = replay(context.runtime, context.app, names, ids=list(letter_ids) or None, group=group, dry_run=dry_run)
    except LookupError as exc:
        raise click.BadParameter(str(exc), param_hint="LETTER_IDS") from None
    if group is not None and not done:
        raise click.BadParameter(f"no parked dead letters in group {group}", param_hint="--group")
    if as_json:
        click.echo(_json([_replayed_json(r) for r in done]))
    else:
        for r in done:
            new = f" as {r.message_id}" if r.message_id else ""
            why = f": {r.detail}" if r.detail else ""
            click.echo(f"{r.letter.service} #{r.letter.id} {r.letter.consumer}: {r.outcome}{new}{why}")
        click.echo(_summary(done))
    if any(r.outcome in (ReplayOutcome.SKIPPED, ReplayOutcome.FAILED) for r in done):
        raise click.exceptions.Exit(1)


def _replayed_json(r: Replayed) -> dict[str, Any]:
    return {
        "service": r.letter.service,
        "id": r.letter.id,
        "outcome": str(r.outcome),
        "message_id": r.message_id,
        "detail": r.detail,
    }


def _summary(done: list[Replayed]) -> str:
    counts: dict[str, int] = {}
    for r in done:
        counts[str(r.outcome)] = counts.get(str(r.outcome), 0) + 1
    return ", ".join(f"{outcome} {n}" for outcome, n in counts.items()) or "nothing to replay"


COMMANDS = [dead_letters_group]
