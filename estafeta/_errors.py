"""Errors raised by steps, routing and settings (all under :class:`sql.errors.EstafetaError`)."""

from __future__ import annotations

from sql.errors import EstafetaError


class SettingsError(EstafetaError):
    """A configuration value is invalid."""

    def __init__(self, variable: str, reason: str) -> None:
        super().__init__(f"{variable}: {reason}")
        #: The environment variable (or TOML key) that holds the bad value.
        self.variable = variable


class BusinessFailure(EstafetaError):
    """The step refused the command for a business reason; retrying will not help.

    Raising it (or a subclass) from a step rolls back the step's own changes but keeps
    the inbox record, so the message is not retried; a saga that sent the command is
    told of the failure and compensates.
    """


class InvalidMessage(EstafetaError):
    """The message cannot be decoded into the step's command class."""


class RoutingError(EstafetaError):
    """No step (or several) handles this command type, or the sender belongs to no app."""
