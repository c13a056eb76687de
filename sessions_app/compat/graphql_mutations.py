"""The manager's GraphQL mutations that the 26.9.6 SDK sends (KeyPair, KeypairResourcePolicy,
ComputeSession.update, Image), and its resource-preset mutations.

Who may: keypairs, as the REST API, admins; resource policies and presets superadmins;
a session's name and priority its owner (within their policy) or an admin. Failures that
are the request's (an unknown name, a bad value) answer `ok: false` with `msg`, as the
manager does; a refusal of who asks, or a mutation this server does not do, is a GraphQL
error saying why. The output types live in graphql.py, named here by their path (graphene
resolves them lazily: graphql.py imports this module).
"""

import json

import graphene
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import Q
from graphene import relay
from graphql import GraphQLError

from common.slots import ResourceSlots, SlotError
from identity_app.acting import actor_of
from identity_app.api.permissions import request_is_admin, request_is_superadmin
from identity_app.models import KeyPair, ResourcePolicy
from scheduling_app.models import ResourcePreset, ScalingGroup, default_of
from sessions_app.compat.graphql_relay import GlobalIDField, uuid_of
from sessions_app.lifecycle.create import change_priority, rename_session
from sessions_app.models import Session
from sessions_app.spec import DomainError

TYPES = "sessions_app.compat.graphql."


def _request(info):
    return info.context


def _require(info, superadmin=False):
    request = _request(info)
    if superadmin and not request_is_superadmin(request):
        raise GraphQLError("Only superadmins may change this.",
                           extensions={"code": "permission-denied"})
    if not request_is_admin(request):
        raise GraphQLError("Only administrators may change this.",
                           extensions={"code": "permission-denied"})


def _given(props, *names):
    """The props the request set (graphene leaves the others out)."""
    return {name: props[name] for name in names if props.get(name) is not None}


def _slots(value, field):
    """Resource slots from a JSON string or object ('{"cpu": "2", "mem": "4g"}')."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            raise ValueError(f"{field} is not JSON: {value!r}.") from None
    try:
        return ResourceSlots.parse(value or {}).to_json()
    except SlotError as exc:
        raise ValueError(f"{field}: {exc}") from None


class Result(graphene.ObjectType):
    ok = graphene.Boolean()
    msg = graphene.String()


class RescanResult(Result):
    task_id = graphene.String()


# -- sessions ----------------------------------------------------------------------------

class ModifyComputeSession(relay.ClientIDMutation):
    """ComputeSession.update: a session's new name and priority."""

    class Input:
        id = GlobalIDField(required=True)
        name = graphene.String()
        priority = graphene.Int()

    item = graphene.Field(TYPES + "ComputeSessionNode")

    @classmethod
    def mutate_and_get_payload(cls, root, info, id, name=None, priority=None, **_relay):
        request = _request(info)
        session_id = uuid_of(id)
        session = session_id and Session.objects.restrict(actor_of(request)).filter(
            pk=session_id).first()
        if not session:
            raise GraphQLError(f"There is no session {id[1]!r}.")
        actor = request.user.get_username()
        try:
            if name is not None:
                session = rename_session(session, name, actor=actor)
            if priority is not None:
                session = change_priority(session, priority, actor=actor,
                                          may_raise=request_is_admin(request))
        except DomainError as exc:
            raise GraphQLError(exc.message) from None
        return ModifyComputeSession(item=Session.objects.get(pk=session.pk))


# -- keypairs (admins, as the REST API) --------------------------------------------------

class KeyPairInput(graphene.InputObjectType):
    is_active = graphene.Boolean(default_value=True)
    is_admin = graphene.Boolean(default_value=False)
    resource_policy = graphene.String()
    concurrency_limit = graphene.Int()  # deprecated by the manager; ignored as there
    rate_limit = graphene.Int()


class ModifyKeyPairInput(graphene.InputObjectType):
    is_active = graphene.Boolean()
    is_admin = graphene.Boolean()
    resource_policy = graphene.String()
    concurrency_limit = graphene.Int()
    rate_limit = graphene.Int()


def _keypair_fields(props):
    fields = _given(props, "is_active", "is_admin", "rate_limit")
    if "rate_limit" in fields and not 1 <= fields["rate_limit"] <= 2**31 - 1:
        raise ValueError("rate_limit must be at least 1.")
    if props.get("resource_policy") is not None:
        policy = ResourcePolicy.objects.filter(name=props["resource_policy"]).first()
        if policy is None:
            raise ValueError(f"There is no resource policy {props['resource_policy']!r}.")
        fields["resource_policy"] = policy
    return fields


class CreateKeyPair(graphene.Mutation):
    class Arguments:
        user_id = graphene.String(required=True)  # the owner's email (or user name)
        props = KeyPairInput(required=True)

    ok = graphene.Boolean()
    msg = graphene.String()
    keypair = graphene.Field(TYPES + "KeyPairType")

    @classmethod
    def mutate(cls, root, info, user_id, props):
        _require(info)
        user = get_user_model().objects.filter(
            Q(email__iexact=user_id) | Q(username=user_id)).order_by("pk").first()
        if user is None:
            return cls(ok=False, msg=f"There is no user {user_id!r}.")
        try:
            fields = _keypair_fields(props)
        except ValueError as exc:
            return cls(ok=False, msg=str(exc))
        fields.setdefault("resource_policy", default_of(ResourcePolicy))
        return cls(ok=True, msg="success", keypair=KeyPair.objects.create(user=user, **fields))


class ModifyKeyPair(graphene.Mutation):
    class Arguments:
        access_key = graphene.String(required=True)
        props = ModifyKeyPairInput(required=True)

    ok = graphene.Boolean()
    msg = graphene.String()

    @classmethod
    def mutate(cls, root, info, access_key, props):
        _require(info)
        try:
            fields = _keypair_fields(props)
        except ValueError as exc:
            return cls(ok=False, msg=str(exc))
        keypairs = KeyPair.objects.filter(pk=access_key)
        if not keypairs.exists():
            return cls(ok=False, msg=f"There is no keypair {access_key!r}.")
        if fields:
            keypairs.update(**fields)
        return cls(ok=True, msg="success")


class DeleteKeyPair(graphene.Mutation):
    class Arguments:
        access_key = graphene.String(required=True)

    ok = graphene.Boolean()
    msg = graphene.String()

    @classmethod
    def mutate(cls, root, info, access_key):
        _require(info)
        keypair = KeyPair.objects.filter(pk=access_key).first()
        if keypair is None:
            return cls(ok=False, msg=f"There is no keypair {access_key!r}.")
        if keypair.is_main:
            return cls(ok=False, msg="A user's main keypair cannot be deleted; deactivate it "
                                     "instead.")
        if keypair.sessions.exists():
            return cls(ok=False, msg="The keypair owns sessions (their history is kept); "
                                     "deactivate it instead.")
        keypair.delete()
        return cls(ok=True, msg="success")


# -- keypair resource policies (superadmins) ---------------------------------------------

POLICY_FIELDS = ("max_session_lifetime", "max_concurrent_sessions", "idle_timeout",
                 "max_pending_session_count")
# What the SDK sends that a policy here has no setting for: said in the answer's msg.
NOT_PER_POLICY = {
    "max_containers_per_session": "the server's MAX_CLUSTER_SIZE applies to every policy",
    "max_concurrent_sftp_sessions": "there are no SFTP sessions",
    "allowed_vfolder_hosts": "storage folders live on their scaling group's storage",
    "max_pending_session_resource_slots": "only the count of pending sessions is limited",
}


class CreateKeyPairResourcePolicyInput(graphene.InputObjectType):
    default_for_unspecified = graphene.String(required=True)
    total_resource_slots = graphene.JSONString()
    max_session_lifetime = graphene.Int()
    max_concurrent_sessions = graphene.Int(required=True)
    max_concurrent_sftp_sessions = graphene.Int()
    max_containers_per_session = graphene.Int(required=True)
    idle_timeout = graphene.Float(required=True)  # the manager's BigInt
    allowed_vfolder_hosts = graphene.JSONString()
    max_pending_session_count = graphene.Int()
    max_pending_session_resource_slots = graphene.JSONString()


class ModifyKeyPairResourcePolicyInput(graphene.InputObjectType):
    default_for_unspecified = graphene.String()
    total_resource_slots = graphene.JSONString()
    max_session_lifetime = graphene.Int()
    max_concurrent_sessions = graphene.Int()
    max_concurrent_sftp_sessions = graphene.Int()
    max_containers_per_session = graphene.Int()
    idle_timeout = graphene.Float()
    allowed_vfolder_hosts = graphene.JSONString()
    max_pending_session_count = graphene.Int()
    max_pending_session_resource_slots = graphene.JSONString()


def _policy_fields(props):
    """The model's fields from the props, and the names set that are not applied here."""
    unlimited = props.get("default_for_unspecified")
    if unlimited is not None and str(unlimited).upper() != "UNLIMITED":
        raise ValueError("default_for_unspecified is UNLIMITED here: a slot a policy's total "
                         "does not name is not limited.")
    fields = {}
    for name in POLICY_FIELDS:
        value = props.get(name)
        if value is None:
            continue
        if value != int(value) or not 0 <= value <= 2**31 - 1:
            raise ValueError(f"{name} must be a whole number, at least 0.")
        fields[name] = int(value)
    if props.get("total_resource_slots") is not None:
        fields["total_resource_slots"] = _slots(props["total_resource_slots"],
                                                "total_resource_slots")
    ignored = sorted(name for name in NOT_PER_POLICY if props.get(name) not in (None, {}, ""))
    return fields, ignored


def _ignored_msg(ignored):
    if not ignored:
        return "success"
    return "success; not applied here: " + "; ".join(
        f"{name} ({NOT_PER_POLICY[name]})" for name in ignored)


class CreateKeyPairResourcePolicy(graphene.Mutation):
    class Arguments:
        name = graphene.String(required=True)
        props = CreateKeyPairResourcePolicyInput(required=True)

    ok = graphene.Boolean()
    msg = graphene.String()
    resource_policy = graphene.Field(TYPES + "KeyPairResourcePolicyType")

    @classmethod
    def mutate(cls, root, info, name, props):
        _require(info, superadmin=True)
        try:
            fields, ignored = _policy_fields(props)
        except ValueError as exc:
            return cls(ok=False, msg=str(exc))
        try:
            with transaction.atomic():
                policy = ResourcePolicy.objects.create(name=name, **fields)
        except IntegrityError:
            return cls(ok=False, msg=f"There is already a resource policy named {name!r}.")
        return cls(ok=True, msg=_ignored_msg(ignored), resource_policy=policy)


class ModifyKeyPairResourcePolicy(graphene.Mutation):
    class Arguments:
        name = graphene.String(required=True)
        props = ModifyKeyPairResourcePolicyInput(required=True)

    ok = graphene.Boolean()
    msg = graphene.String()

    @classmethod
    def mutate(cls, root, info, name, props):
        _require(info, superadmin=True)
        try:
            fields, ignored = _policy_fields(props)
        except ValueError as exc:
            return cls(ok=False, msg=str(exc))
        policy = ResourcePolicy.objects.filter(name=name).first()
        if policy is None:
            return cls(ok=False, msg=f"There is no resource policy {name!r}.")
        for field, value in fields.items():
            setattr(policy, field, value)
        policy.save()
        return cls(ok=True, msg=_ignored_msg(ignored))


class DeleteKeyPairResourcePolicy(graphene.Mutation):
    class Arguments:
        name = graphene.String(required=True)

    ok = graphene.Boolean()
    msg = graphene.String()

    @classmethod
    def mutate(cls, root, info, name):
        _require(info, superadmin=True)
        policy = ResourcePolicy.objects.filter(name=name).first()
        if policy is None:
            return cls(ok=False, msg=f"There is no resource policy {name!r}.")
        if KeyPair.objects.filter(resource_policy=policy).exists():
            return cls(ok=False, msg=f"Keypairs still use the resource policy {name!r}.")
        policy.delete()
        return cls(ok=True, msg="success")


# -- resource presets (superadmins) ------------------------------------------------------

class CreateResourcePresetInput(graphene.InputObjectType):
    resource_slots = graphene.JSONString(required=True)
    shared_memory = graphene.String()
    scaling_group_name = graphene.String()


class ModifyResourcePresetInput(graphene.InputObjectType):
    name = graphene.String()
    resource_slots = graphene.JSONString()
    shared_memory = graphene.String()
    scaling_group_name = graphene.String()


def _preset_fields(props):
    fields = {}
    if props.get("resource_slots") is not None:
        fields["resource_slots"] = _slots(props["resource_slots"], "resource_slots")
        if not {"cpu", "mem"} <= set(fields["resource_slots"]):
            raise ValueError("resource_slots must give cpu and mem.")
    if props.get("shared_memory") is not None:
        shared = props["shared_memory"]
        fields["shared_memory"] = None if shared == "" else int(
            ResourceSlots.parse({"mem": shared})["mem"])
    if props.get("scaling_group_name") is not None:
        name = props["scaling_group_name"]
        group = ScalingGroup.objects.filter(name=name).first() if name else None
        if name and group is None:
            raise ValueError(f"There is no scaling group {name!r}.")
        fields["scaling_group"] = group
    if props.get("name"):
        fields["name"] = props["name"]
    return fields


def _preset(id=None, name=None):
    if id is not None:
        return ResourcePreset.objects.filter(pk=id).first()
    return ResourcePreset.objects.filter(name=name).first() if name else None


class CreateResourcePreset(graphene.Mutation):
    class Arguments:
        name = graphene.String(required=True)
        props = CreateResourcePresetInput(required=True)

    ok = graphene.Boolean()
    msg = graphene.String()
    resource_preset = graphene.Field(TYPES + "ResourcePresetType")

    @classmethod
    def mutate(cls, root, info, name, props):
        _require(info, superadmin=True)
        try:
            fields = _preset_fields(props)
            with transaction.atomic():
                preset = ResourcePreset.objects.create(name=name, **fields)
        except (ValueError, SlotError) as exc:
            return cls(ok=False, msg=str(exc))
        except IntegrityError:
            return cls(ok=False, msg=f"There is already a resource preset named {name!r}.")
        return cls(ok=True, msg="success", resource_preset=preset)


class ModifyResourcePreset(graphene.Mutation):
    class Arguments:
        id = graphene.UUID()
        name = graphene.String()
        props = ModifyResourcePresetInput(required=True)

    ok = graphene.Boolean()
    msg = graphene.String()

    @classmethod
    def mutate(cls, root, info, props, id=None, name=None):
        _require(info, superadmin=True)
        preset = _preset(id, name)
        if preset is None:
            return cls(ok=False, msg=f"There is no resource preset {id or name!r}.")
        try:
            for field, value in _preset_fields(props).items():
                setattr(preset, field, value)
            with transaction.atomic():
                preset.save()
        except (ValueError, SlotError) as exc:
            return cls(ok=False, msg=str(exc))
        except IntegrityError:
            return cls(ok=False, msg=f"There is already a resource preset named "
                                     f"{props.get('name')!r}.")
        return cls(ok=True, msg="success")


class DeleteResourcePreset(graphene.Mutation):
    class Arguments:
        id = graphene.UUID()
        name = graphene.String()

    ok = graphene.Boolean()
    msg = graphene.String()

    @classmethod
    def mutate(cls, root, info, id=None, name=None):
        _require(info, superadmin=True)
        preset = _preset(id, name)
        if preset is None:
            return cls(ok=False, msg=f"There is no resource preset {id or name!r}.")
        preset.delete()
        return cls(ok=True, msg="success")


# -- images: what this server does not do ------------------------------------------------

IMAGES_ARE_REPORTED = ("the images here are the ones each agent reports from its Docker "
                       "engine at every heartbeat")


def _not_supported(what, why):
    def mutate(root, info, **_args):
        raise GraphQLError(f"{what} is not supported by this server: {why}.",
                           extensions={"code": "not-implemented"})
    return mutate


class PurgeImageOptions(graphene.InputObjectType):
    remove_from_registry = graphene.Boolean(default_value=False)


class PurgedImage(graphene.ObjectType):
    image = graphene.Field(TYPES + "ImageType")


def unsupported_image_mutation(what, why, result=Result, **arguments):
    return graphene.Field(result, args=arguments, resolver=_not_supported(what, why))


class Mutation(graphene.ObjectType):
    modify_compute_session = ModifyComputeSession.Field()
    create_keypair = CreateKeyPair.Field()
    modify_keypair = ModifyKeyPair.Field()
    delete_keypair = DeleteKeyPair.Field()
    create_keypair_resource_policy = CreateKeyPairResourcePolicy.Field()
    modify_keypair_resource_policy = ModifyKeyPairResourcePolicy.Field()
    delete_keypair_resource_policy = DeleteKeyPairResourcePolicy.Field()
    create_resource_preset = CreateResourcePreset.Field()
    modify_resource_preset = ModifyResourcePreset.Field()
    delete_resource_preset = DeleteResourcePreset.Field()
    rescan_images = unsupported_image_mutation(
        "Rescanning a registry", f"there is no registry to scan: {IMAGES_ARE_REPORTED}",
        result=RescanResult, registry=graphene.String(), project=graphene.String())
    forget_image = unsupported_image_mutation(
        "Forgetting an image", f"{IMAGES_ARE_REPORTED}, so a forgotten image would be back "
        "at the next one; remove it from the agents' engines instead",
        reference=graphene.String(required=True), architecture=graphene.String(required=True))
    forget_image_by_id = unsupported_image_mutation(
        "Forgetting an image", f"{IMAGES_ARE_REPORTED}, so a forgotten image would be back "
        "at the next one; remove it from the agents' engines instead",
        image_id=graphene.String(required=True))
    purge_image_by_id = graphene.Field(
        PurgedImage, image_id=graphene.String(required=True),
        options=PurgeImageOptions(),
        resolver=_not_supported("Purging an image", "images are removed from each agent's "
                                "Docker engine by its operator (docker rmi)"))
    untag_image_from_registry = unsupported_image_mutation(
        "Untagging an image in a registry", "this server does not write to registries",
        image_id=graphene.String(required=True))
    alias_image = unsupported_image_mutation(
        "Image aliases", "images are named by their reference only", alias=graphene.String(
            required=True), target=graphene.String(required=True),
        architecture=graphene.String())
    dealias_image = unsupported_image_mutation(
        "Image aliases", "images are named by their reference only",
        alias=graphene.String(required=True))

