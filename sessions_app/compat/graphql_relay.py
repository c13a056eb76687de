"""Relay's pieces the manager's GraphQL uses (API v8): global ids, which the clients send
as base64 of "<type name>:<id>" or as a bare id, and connections that carry `count`."""

import base64
import binascii
import uuid

import graphene
from graphene import relay
from graphql import GraphQLError, StringValueNode


def from_global_id(value):
    """(type name, id) of a Relay global id: base64 of "<type name>:<id>". A value that is
    not one (a bare UUID, as ComputeSession.update sends it) is the id itself."""
    try:
        decoded = base64.b64decode(value, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return "", value
    type_name, sep, raw = decoded.partition(":")
    return (type_name, raw) if sep and raw else ("", value)


class GlobalIDField(graphene.Scalar):
    """The manager's GlobalIDField: a Relay global id ("<type>:<id>" in base64), or a bare
    UUID or text; read as (type name, id)."""

    @staticmethod
    def serialize(value):
        return value

    @staticmethod
    def parse_value(value):
        if not isinstance(value, str):
            raise GraphQLError("A global id is a string.")
        return from_global_id(value)

    @staticmethod
    def parse_literal(node, _variables=None):
        if isinstance(node, StringValueNode):
            return from_global_id(node.value)
        raise GraphQLError("A global id is a string.")


def uuid_of(global_id):
    """The UUID a GlobalIDField names, or None."""
    try:
        return uuid.UUID(str(global_id[1]))
    except ValueError:
        return None


class CountedConnection(relay.Connection):
    """The manager's connections carry `count`, the number of nodes in all."""

    class Meta:
        abstract = True

    count = graphene.Int()

    def resolve_count(connection, info):
        return len(connection.iterable)
