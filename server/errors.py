"""What ends a client's stream early: one error class per gRPC status a client may be given.

Domain code (the policy host, the sessions' service) raises these with a message a person can act on;
`PolicyService.STATUS` maps each class to its status code in one place. What the codec finds wrong in a message
(`rlgate.core.codec.CodecError`) is a BadRequest too.
"""

from __future__ import annotations


class StreamError(Exception):
    """Ends a client's stream with its class's status and this message."""


class BadRequest(StreamError):
    """INVALID_ARGUMENT: something the client sent is wrong (a field, a count, a size)."""


class WrongState(StreamError):
    """FAILED_PRECONDITION: a message out of order (a step before the hello), or a client of another kind of run
    than the one served (spaces, agents)."""


class UnknownModule(StreamError):
    """NOT_FOUND: the hello asks for a module this server does not serve."""


class OverLimit(StreamError):
    """RESOURCE_EXHAUSTED: a limit of this server (sessions, sub-envs, model size)."""


class NotServing(StreamError):
    """UNAVAILABLE: shutting down, or no model yet; another server (or a later try) may serve it."""


class IdleTimeout(StreamError):
    """DEADLINE_EXCEEDED: the client sent nothing, or took no answer, for the idle timeout."""
