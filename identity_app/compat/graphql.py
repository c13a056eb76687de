"""The Backend.AI manager's GraphQL types of keypairs and their resource policies (the
schema and its queries: sessions_app/compat/graphql.py). A keypair's secret key is
answered only to its own holder (who signed the request with it), never to anyone else."""

import graphene
from django.conf import settings
from graphene_django import DjangoObjectType

from identity_app.models import KeyPair, ResourcePolicy


def email_of(user):
    return user.email or user.get_username()


def full_name_of(user):
    return user.get_full_name() or user.get_username()


class UserInfo(graphene.ObjectType):
    email = graphene.String()
    full_name = graphene.String()


class KeyPairType(DjangoObjectType):
    """A keypair, as the manager's KeyPair; `user_id` is the owner's email, as there."""

    class Meta:
        model = KeyPair
        name = "KeyPair"
        fields = ("access_key", "is_active", "is_admin", "rate_limit", "concurrency_used",
                  "last_used", "created_at")

    user_id = graphene.String()
    full_name = graphene.String()
    user_info = graphene.Field(UserInfo)
    user = graphene.String()
    projects = graphene.List(graphene.String)
    secret_key = graphene.String()
    resource_policy = graphene.String()
    modified_at = graphene.DateTime()
    num_queries = graphene.Int()
    concurrency_limit = graphene.Int()
    ssh_public_key = graphene.String()
    ssh_private_key = graphene.String()
    dotfiles = graphene.String()
    bootstrap_script = graphene.String()

    def resolve_user_id(keypair, info):
        return email_of(keypair.user)

    def resolvefull_name_of(keypair, info):
        return full_name_of(keypair.user)

    def resolve_user_info(keypair, info):
        return UserInfo(email=email_of(keypair.user), full_name=full_name_of(keypair.user))

    def resolve_user(keypair, info):
        return keypair.user_id

    def resolve_projects(keypair, info):
        """The projects its owner is a member of or has run sessions in."""
        joined = keypair.user.member_projects.values_list("name", flat=True)
        used = keypair.sessions.values_list("project__name", flat=True).distinct()
        return sorted({*joined, *used})

    def resolve_secret_key(keypair, info):
        # Its holder signed this request with it; nobody else is ever shown it.
        asking = info.context.auth
        return keypair.secret_key if isinstance(asking, KeyPair) and \
            asking.access_key == keypair.access_key else None

    def resolve_resource_policy(keypair, info):
        return keypair.resource_policy.name

    def resolve_modified_at(keypair, info):
        return keypair.created_at

    def resolve_num_queries(keypair, info):
        return 0

    def resolve_concurrency_limit(keypair, info):
        return getattr(keypair.resource_policy, "max_concurrent_sessions", None)

    def resolve_ssh_public_key(keypair, info):
        return None

    resolve_ssh_private_key = resolve_ssh_public_key

    def resolve_dotfiles(keypair, info):
        return "[]"

    def resolve_bootstrap_script(keypair, info):
        return ""


class KeyPairResourcePolicyType(DjangoObjectType):
    """A resource policy, as the manager's KeyPairResourcePolicy. Slot totals are JSON
    strings; what this server has no such setting for answers its fixed value here."""

    class Meta:
        model = ResourcePolicy
        name = "KeyPairResourcePolicy"
        fields = ("name", "max_concurrent_sessions", "max_pending_session_count",
                  "idle_timeout", "max_session_lifetime")

    created_at = graphene.DateTime()
    default_for_unspecified = graphene.String()
    total_resource_slots = graphene.JSONString()
    max_containers_per_session = graphene.Int()
    max_concurrent_sftp_sessions = graphene.Int()
    max_pending_session_resource_slots = graphene.JSONString()
    allowed_vfolder_hosts = graphene.JSONString()

    def resolve_created_at(policy, info):
        return None  # not recorded here

    def resolve_default_for_unspecified(policy, info):
        return "UNLIMITED"  # a slot the total does not name is not limited

    def resolve_total_resource_slots(policy, info):
        return policy.total_resource_slots

    def resolve_max_containers_per_session(policy, info):
        return settings.MAX_CLUSTER_SIZE

    def resolve_max_concurrent_sftp_sessions(policy, info):
        return 0  # no SFTP sessions here

    def resolve_max_pending_session_resource_slots(policy, info):
        return None

    def resolve_allowed_vfolder_hosts(policy, info):
        return {}
