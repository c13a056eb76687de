"""The Backend.AI manager's GraphQL at /admin/gql, as far as the client's SDK and commands
ask it (graphene-django): `session list` / `ps` and `admin session list`
(compute_session_list), `session info` (compute_session), the SDK's
`ComputeSession.detail` (the Relay node compute_session_node, with its kernel_nodes),
`admin agent list|info` (agent_list, agent), `image list` / `admin image list` (images),
`admin keypair info|list` (keypair, keypairs, keypair_list; the session list asks
`keypair { is_admin }` first), `admin keypair-resource-policy info|list`
(keypair_resource_policy, keypair_resource_policies) and resource presets (resource_preset,
resource_presets). The mutations are in graphql_mutations.py.

The names, argument types and value shapes are the manager's (API v7): JSON
values (slots, status data, stats) are JSON *strings*, as graphene's JSONString answers
them and the client's formatters read them; statuses, session types and results are upper
case. The same visibility as the REST API: a user sees their own sessions and keypairs and
every image; admins see everything, and only they see agents. A keypair's secret key is
answered only to its own holder (who signed the request with it), never to anyone else.
"""

import graphene
from django.contrib.auth import get_user_model
from django.db.models import Q
from drf_spectacular.utils import extend_schema
from graphene import relay
from graphene_django import DjangoObjectType
from graphene_django.views import GraphQLView
from graphql import GraphQLError
from rest_framework import exceptions
from rest_framework.views import APIView

from agents_app.compat.graphql import ImageType
from agents_app.models import Agent, AgentStatus, Image
from common import clock
from common.devices import device_ids
from identity_app.acting import actor_of
from identity_app.api.permissions import acting_keypair, request_is_admin
from identity_app.compat.graphql import KeyPairResourcePolicyType, KeyPairType, email_of
from identity_app.models import KeyPair, ResourcePolicy
from scheduling_app.compat.graphql import ResourcePresetType
from scheduling_app.idle import checks_of as idle_checks_of
from scheduling_app.models import ResourcePreset
from sessions_app import service_ports
from sessions_app.api.errors import error_body
from sessions_app.compat.graphql_mutations import Mutation
from sessions_app.compat.graphql_relay import CountedConnection, GlobalIDField, uuid_of
from sessions_app.models import Kernel, Session
from storage_app.compat.graphql import FolderQueries

MAX_PAGE_SIZE = 100  # the client's own limit (ai.backend.client.pagination)


def _upper(value):
    return value.upper() if value else value


def _request(info):
    return info.context


def _is_admin(info):
    return request_is_admin(_request(info))


def _images(info):
    """Every image but those committed from other users' sessions (admins: every one)."""
    return Image.objects.usable_by(None if _is_admin(info) else _request(info).user.pk)


def _require_admin(info, what):
    if not _is_admin(info):
        raise GraphQLError(f"Only administrators may see {what}.",
                           extensions={"code": "permission-denied"})


def _page(queryset, limit, offset):
    if not MAX_PAGE_SIZE >= limit >= 1:
        raise GraphQLError(f"limit must be between 1 and {MAX_PAGE_SIZE}.")
    if offset < 0:
        raise GraphQLError("offset must not be negative.")
    return {"items": list(queryset[offset:offset + limit]), "total_count": queryset.count()}


def _ordered(queryset, order, fields):
    """`order` as the client sends it: comma-separated names, each with an optional + or -
    (descending); `fields` maps the GraphQL names that may be ordered on to model lookups."""
    if not order:
        return queryset
    lookups = []
    for part in order.split(","):
        part = part.strip()
        descending = part.startswith("-")
        name = part.lstrip("+-").strip()
        if name not in fields:
            raise GraphQLError(f"Cannot order by {name!r}; known: {', '.join(sorted(fields))}.")
        lookups.append(("-" if descending else "") + fields[name])
    return queryset.order_by(*lookups)


def _no_filter(filter_):
    # The manager's filter language is not spoken here; saying so beats ignoring it.
    if filter_:
        raise GraphQLError("Filter expressions (--filter) are not supported by this server; "
                           "use the status, access key and scaling group options.")


def _names(text):
    return [part.strip().upper() for part in (text or "").split(",") if part.strip()]


# -- types -------------------------------------------------------------------------------

def page_of(name, item_type):
    """The manager's page of a paginated list: `items` and `total_count`."""
    return type(name, (graphene.ObjectType,), {
        "items": graphene.List(item_type, required=True),
        "total_count": graphene.Int(required=True)})


class ComputeContainer(DjangoObjectType):
    """A kernel, as the manager's ComputeContainer."""

    class Meta:
        model = Kernel
        name = "ComputeContainer"
        fields = ("id", "cluster_idx", "cluster_role", "image", "status", "status_info",
                  "status_changed", "container_id", "created_at", "terminated_at")
        convert_choices_to_enum = False

    idx = graphene.Int()
    role = graphene.String()
    hostname = graphene.String()
    kernel_id = graphene.UUID()
    local_rank = graphene.Int()
    cluster_hostname = graphene.String()
    session_id = graphene.UUID()
    architecture = graphene.String()
    registry = graphene.String()
    status_data = graphene.JSONString()
    agent = graphene.String()
    agent_addr = graphene.String()
    resource_opts = graphene.JSONString()
    occupied_slots = graphene.JSONString()
    attached_devices = graphene.JSONString()
    live_stat = graphene.JSONString()
    last_stat = graphene.JSONString()
    preopen_ports = graphene.List(graphene.Int)
    exit_code = graphene.Int()

    def resolve_idx(kernel, info):
        return kernel.cluster_idx

    def resolve_status_changed(kernel, info):
        return kernel.status_changed or kernel.created_at

    def resolve_role(kernel, info):
        return kernel.cluster_role

    def resolve_hostname(kernel, info):
        return kernel.cluster_hostname

    resolve_cluster_hostname = resolve_hostname

    def resolve_kernel_id(kernel, info):
        return kernel.pk

    def resolve_local_rank(kernel, info):
        return kernel.cluster_idx - 1

    def resolve_session_id(kernel, info):
        return kernel.session_id

    def resolve_architecture(kernel, info):
        return kernel.agent.architecture if kernel.agent_id else "x86_64"

    def resolve_registry(kernel, info):
        return ""

    def resolve_status_data(kernel, info):
        return kernel.status_data

    def resolve_agent(kernel, info):
        return kernel.agent_id

    def resolve_agent_addr(kernel, info):
        return kernel.agent_addr

    def resolve_resource_opts(kernel, info):
        return {}

    def resolve_occupied_slots(kernel, info):
        return kernel.occupied_slots

    def resolve_attached_devices(kernel, info):
        """Backend.AI's shape: {kind: [{device_id, model_name, data}]}, of the devices the
        kernel holds (its agent's report of each)."""
        known = {(d.get("kind"), d.get("id")): d for d in
                 (kernel.agent.devices if kernel.agent_id else [])}
        attached = {}
        for kind, ids in device_ids(kernel.device_allocation).items():
            attached[kind] = [{"device_id": i,
                               "model_name": known.get((kind, i), {}).get("model", ""),
                               "data": {"mem": known.get((kind, i), {}).get("memory")}}
                              for i in ids]
        return attached

    def resolve_live_stat(kernel, info):
        return kernel.last_stat or None

    def resolve_last_stat(kernel, info):
        return kernel.last_stat or None

    def resolve_preopen_ports(kernel, info):
        return []

    def resolve_exit_code(kernel, info):
        return kernel.exit_code


class SessionFields:
    """The resolvers both session types of the SDK share: the classic ComputeSession and
    the Relay node ComputeSessionNode."""

    def resolve_type(session, info):
        return _upper(session.session_type)

    def resolve_domain_name(session, info):
        return session.domain.name

    def resolve_user_id(session, info):
        return session.user_id

    def resolve_access_key(session, info):
        return session.keypair_id

    def resolve_status_history(session, info):
        return dict(sorted(session.status_history.items(), key=lambda item: item[1]))

    def resolve_scheduled_at(session, info):
        return session.status_history.get("SCHEDULED")

    def resolve_result(session, info):
        return _upper(session.result)

    def resolve_abusing_reports(session, info):
        return []

    def resolve_idle_checks(session, info):
        return idle_checks_of(session, clock.now())

    def resolve_agent_ids(session, info):
        return sorted({k.agent_id for k in session.kernels.all() if k.agent_id})

    def resolve_resource_opts(session, info):
        return {}

    def resolve_scaling_group(session, info):
        return session.scaling_group.name

    def resolve_service_ports(session, info):
        return [port.as_backendai() for port in service_ports.of_image(session.image)]

    def resolve_num_queries(session, info):
        return 0


class ComputeSession(SessionFields, DjangoObjectType):
    """A session, as the manager's ComputeSession."""

    class Meta:
        model = Session
        name = "ComputeSession"
        fields = ("id", "name", "tag", "image", "cluster_mode", "cluster_size", "priority",
                  "status", "status_info", "status_changed", "created_at", "terminated_at",
                  "starts_at", "startup_command")
        convert_choices_to_enum = False

    session_id = graphene.UUID()
    main_kernel_id = graphene.UUID()
    type = graphene.String()
    main_kernel_role = graphene.String()
    architecture = graphene.String()
    registry = graphene.String()
    cluster_template = graphene.String()
    domain_name = graphene.String()
    group_name = graphene.String()
    group_id = graphene.String()
    user_email = graphene.String()
    user_id = graphene.String()
    access_key = graphene.String()
    created_user_email = graphene.String()
    created_user_id = graphene.String()
    status_data = graphene.JSONString()
    status_history = graphene.JSONString()
    scheduled_at = graphene.DateTime()
    result = graphene.String()
    commit_status = graphene.String()
    abusing_reports = graphene.List(graphene.JSONString)
    idle_checks = graphene.JSONString()
    agent_ids = graphene.List(graphene.String)
    resource_opts = graphene.JSONString()
    scaling_group = graphene.String()
    service_ports = graphene.JSONString()
    mounts = graphene.List(graphene.String)
    vfolder_mounts = graphene.List(graphene.String)
    occupying_slots = graphene.JSONString()
    occupied_slots = graphene.JSONString()
    requested_slots = graphene.JSONString()
    num_queries = graphene.Int()
    containers = graphene.List(ComputeContainer)
    dependencies = graphene.List(lambda: ComputeSession)

    def resolve_session_id(session, info):
        return session.pk

    def resolve_status_changed(session, info):
        # The manager stamps it at creation; here the first transition does.
        return session.status_changed or session.created_at

    def resolve_main_kernel_id(session, info):
        kernels = session.kernels.all()
        return session.main_kernel.pk if kernels else None

    def resolve_main_kernel_role(session, info):
        return "MAIN"

    def resolve_architecture(session, info):
        agents = [k.agent for k in session.kernels.all() if k.agent_id]
        return agents[0].architecture if agents else "x86_64"

    def resolve_registry(session, info):
        return ""

    def resolve_group_name(session, info):
        return session.project.name

    def resolve_group_id(session, info):
        return session.project_id

    def resolve_user_email(session, info):
        return email_of(session.user)

    resolve_created_user_email = resolve_user_email

    resolve_created_user_id = SessionFields.resolve_user_id

    def resolve_status_data(session, info):
        return session.status_data

    def resolve_mounts(session, info):
        return []

    resolve_vfolder_mounts = resolve_mounts

    def resolve_occupying_slots(session, info):
        return session.occupying_slots

    resolve_occupied_slots = resolve_occupying_slots

    def resolve_requested_slots(session, info):
        return session.requested_slots

    def resolve_containers(session, info):
        return sorted(session.kernels.all(), key=lambda k: (k.cluster_role != "main",
                                                            k.cluster_idx))

    def resolve_dependencies(session, info):
        # Only those the asker may see: a dependency is another session of the same owner.
        return list(session.dependencies.restrict(actor_of(_request(info))))


ComputeSessionList = page_of("ComputeSessionList", ComputeSession)


class AgentType(DjangoObjectType):
    """An agent, as the manager's Agent."""

    class Meta:
        model = Agent
        name = "Agent"
        fields = ("id", "status", "schedulable", "addr", "region", "architecture", "version",
                  "first_contact", "lost_at")
        convert_choices_to_enum = False

    status_changed = graphene.DateTime()
    scaling_group = graphene.String()
    available_slots = graphene.JSONString()
    occupied_slots = graphene.JSONString()
    live_stat = graphene.JSONString()
    compute_plugins = graphene.JSONString()
    hardware_metadata = graphene.JSONString()
    local_config = graphene.JSONString()
    container_count = graphene.Int()
    cpu_cur_pct = graphene.Float()
    mem_cur_bytes = graphene.Float()
    compute_containers = graphene.List(ComputeContainer, status=graphene.String())

    def resolve_status_changed(agent, info):
        return agent.lost_at if agent.status == AgentStatus.LOST else agent.first_contact

    def resolve_scaling_group(agent, info):
        return agent.scaling_group.name

    def resolve_available_slots(agent, info):
        return agent.available_slots

    def resolve_occupied_slots(agent, info):
        return agent.occupied_slots

    def resolve_live_stat(agent, info):
        """Its devices' last measures, in Backend.AI's shape: {"devices": {"cuda_util":
        {device id: {current, capacity}}, "cuda_mem": {...}}}."""
        devices = {}
        for device in agent.devices or []:
            kind, device_id = device.get("kind"), device.get("id")
            if "utilization" in device:
                devices.setdefault(f"{kind}_util", {})[device_id] = {
                    "current": str(device["utilization"]), "capacity": "100"}
            if "mem_used" in device:
                devices.setdefault(f"{kind}_mem", {})[device_id] = {
                    "current": str(device["mem_used"]),
                    "capacity": str(device.get("mem_total"))}
        return {"node": {}, "devices": devices}

    def resolve_compute_plugins(agent, info):
        """{kind: {plugin, devices}} of the device plugins it enabled."""
        plugins = {}
        for device in agent.devices or []:
            entry = plugins.setdefault(device.get("kind"), {"plugin": device.get("plugin"),
                                                            "devices": []})
            entry["devices"].append({k: device.get(k) for k in ("id", "model", "memory",
                                                                 "numa_node")})
        return plugins

    def resolve_hardware_metadata(agent, info):
        return {}

    def resolve_local_config(agent, info):
        return {"agent": {"id": agent.id, "region": agent.region,
                          "scaling-group": agent.scaling_group.name},
                "container": {"scratch-type": "hostdir"}}

    def resolve_container_count(agent, info):
        return len(agent.containers or [])

    def resolve_cpu_cur_pct(agent, info):
        return 0.0

    def resolve_mem_cur_bytes(agent, info):
        return 0.0

    def resolve_compute_containers(agent, info, status=None):
        kernels = agent.kernels.select_related("agent").live()
        if status:
            kernels = kernels.filter(status__in=_names(status))
        return kernels


AgentList = page_of("AgentList", AgentType)


KeyPairList = page_of("KeyPairList", KeyPairType)


# -- Relay nodes (API v8: the SDK's ComputeSession.detail) -------------------------------

class KernelNode(graphene.ObjectType):
    """A kernel, as the manager's KernelNode."""

    class Meta:
        interfaces = (relay.Node,)

    row_id = graphene.UUID()
    cluster_idx = graphene.Int()
    local_rank = graphene.Int()
    cluster_role = graphene.String()
    cluster_hostname = graphene.String()
    session_id = graphene.UUID()
    image_reference = graphene.String()
    architecture = graphene.String()
    status = graphene.String()
    status_changed = graphene.DateTime()
    status_info = graphene.String()
    status_data = graphene.JSONString()
    created_at = graphene.DateTime()
    terminated_at = graphene.DateTime()
    starts_at = graphene.DateTime()
    scheduled_at = graphene.DateTime()
    agent_id = graphene.String()
    agent_addr = graphene.String()
    container_id = graphene.String()
    resource_opts = graphene.JSONString()
    occupied_slots = graphene.JSONString()
    live_stat = graphene.JSONString()
    abusing_report = graphene.JSONString()
    preopen_ports = graphene.List(graphene.Int)

    def resolve_row_id(kernel, info):
        return kernel.pk

    def resolve_local_rank(kernel, info):
        return kernel.cluster_idx - 1

    def resolve_image_reference(kernel, info):
        return kernel.image

    def resolve_architecture(kernel, info):
        return kernel.agent.architecture if kernel.agent_id else "x86_64"

    def resolve_status_changed(kernel, info):
        return kernel.status_changed or kernel.created_at

    def resolve_starts_at(kernel, info):
        return kernel.session.not_before or kernel.session.starts_at

    def resolve_scheduled_at(kernel, info):
        return kernel.status_history.get("SCHEDULED")

    def resolve_resource_opts(kernel, info):
        return {}

    def resolve_live_stat(kernel, info):
        return kernel.last_stat or None

    def resolve_abusing_report(kernel, info):
        return None

    def resolve_preopen_ports(kernel, info):
        return []


class KernelConnection(CountedConnection):
    class Meta:
        node = KernelNode


SESSION_PERMISSIONS = ["read_attribute", "update_attribute", "delete_session", "start_app",
                       "execute"]


class ComputeSessionNode(SessionFields, graphene.ObjectType):
    """A session, as the manager's ComputeSessionNode (its `id` is the Relay global id,
    `row_id` the session's own)."""

    class Meta:
        interfaces = (relay.Node,)

    row_id = graphene.UUID()
    tag = graphene.String()
    name = graphene.String()
    type = graphene.String()
    priority = graphene.Int()
    cluster_template = graphene.String()
    cluster_mode = graphene.String()
    cluster_size = graphene.Int()
    domain_name = graphene.String()
    project_id = graphene.String()
    user_id = graphene.String()
    access_key = graphene.String()
    permissions = graphene.List(graphene.String)
    status = graphene.String()
    status_info = graphene.String()
    status_data = graphene.JSONString()
    status_history = graphene.JSONString()
    created_at = graphene.DateTime()
    terminated_at = graphene.DateTime()
    starts_at = graphene.DateTime()
    scheduled_at = graphene.DateTime()
    queue_position = graphene.Int()
    startup_command = graphene.String()
    result = graphene.String()
    commit_status = graphene.String()
    abusing_reports = graphene.List(graphene.JSONString)
    idle_checks = graphene.JSONString()
    agent_ids = graphene.List(graphene.String)
    resource_opts = graphene.JSONString()
    scaling_group = graphene.String()
    service_ports = graphene.JSONString()
    vfolder_mounts = graphene.List(graphene.String)
    occupied_slots = graphene.JSONString()
    requested_slots = graphene.JSONString()
    image_references = graphene.List(graphene.String)
    num_queries = graphene.Int()
    inference_metrics = graphene.JSONString()
    kernel_nodes = relay.ConnectionField(KernelConnection)
    dependees = relay.ConnectionField(lambda: ComputeSessionConnection)
    dependents = relay.ConnectionField(lambda: ComputeSessionConnection)
    graph = relay.ConnectionField(lambda: ComputeSessionConnection)

    def resolve_row_id(session, info):
        return session.pk

    def resolve_project_id(session, info):
        return session.project_id

    def resolve_permissions(session, info):
        return SESSION_PERMISSIONS

    def resolve_starts_at(session, info):
        # Backend.AI's starts_at is the start asked for; a session asked for none: when
        # it started.
        return session.not_before or session.starts_at

    def resolve_queue_position(session, info):
        return (session.queue or {}).get("position")

    def resolve_vfolder_mounts(session, info):
        return [str(mount.folder_id) for mount in session.mounts.all()]

    def resolve_occupied_slots(session, info):
        return session.occupying_slots

    def resolve_image_references(session, info):
        return sorted({k.image for k in session.kernels.all()} or {session.image})

    def resolve_kernel_nodes(session, info, **_page):
        return sorted(session.kernels.all(), key=lambda k: (k.cluster_role != "main",
                                                            k.cluster_idx))

    def resolve_dependees(session, info, **_page):
        """The sessions it depends on (that the asker may see)."""
        return list(visible_sessions(info).filter(dependents=session))

    def resolve_dependents(session, info, **_page):
        return list(visible_sessions(info).filter(dependencies=session))

    def resolve_graph(session, info, **_page):
        """It and every session it depends on, directly or not."""
        found, frontier = {session.pk: session}, [session]
        while frontier:
            nxt = [s for s in visible_sessions(info).filter(dependents__in=frontier)
                   .exclude(pk__in=list(found)).distinct()]
            found.update((s.pk, s) for s in nxt)
            frontier = nxt
        return list(found.values())


class ComputeSessionConnection(CountedConnection):
    class Meta:
        node = ComputeSessionNode


# -- queries -----------------------------------------------------------------------------

SESSION_ORDER = {"created_at": "created_at", "name": "name", "status": "status",
                 "status_changed": "status_changed", "terminated_at": "terminated_at",
                 "priority": "priority", "type": "session_type", "image": "image",
                 "access_key": "keypair_id", "id": "id", "session_id": "id"}
AGENT_ORDER = {"id": "id", "status": "status", "first_contact": "first_contact",
               "scaling_group": "scaling_group__name", "region": "region",
               "architecture": "architecture", "addr": "addr", "lost_at": "lost_at"}
KEYPAIR_ORDER = {"access_key": "access_key", "created_at": "created_at",
                 "last_used": "last_used", "is_active": "is_active", "is_admin": "is_admin",
                 "user_id": "user__email", "rate_limit": "rate_limit",
                 "concurrency_used": "concurrency_used"}


def visible_sessions(info):
    request = _request(info)
    return (Session.objects.select_related("domain", "project", "user", "keypair",
                                           "scaling_group")
            .prefetch_related("kernels__agent")
            .restrict(actor_of(request)))


def visible_keypairs(info):
    return KeyPair.objects.select_related("user", "resource_policy").restrict(
        actor_of(_request(info)))


def _by_email(keypairs, email):
    if email is None:
        return keypairs
    users = get_user_model().objects.filter(Q(email__iexact=email) | Q(username=email))
    return keypairs.filter(user__in=users)


class Query(FolderQueries):  # and the folder lists of storage_app/compat/graphql.py
    compute_session = graphene.Field(ComputeSession, id=graphene.UUID(required=True))
    compute_session_node = graphene.Field(
        ComputeSessionNode, id=GlobalIDField(required=True), scope_id=graphene.String(),
        project_id=graphene.UUID(), permission=graphene.String())
    compute_session_list = graphene.Field(
        ComputeSessionList, limit=graphene.Int(required=True),
        offset=graphene.Int(required=True), filter=graphene.String(),
        order=graphene.String(), domain_name=graphene.String(), group_id=graphene.String(),
        access_key=graphene.String(), status=graphene.String())
    agent = graphene.Field(AgentType, agent_id=graphene.String(required=True))
    agents = graphene.List(AgentType, scaling_group=graphene.String(),
                           status=graphene.String())
    agent_list = graphene.Field(
        AgentList, limit=graphene.Int(required=True), offset=graphene.Int(required=True),
        filter=graphene.String(), order=graphene.String(),
        scaling_group=graphene.String(), status=graphene.String())
    image = graphene.Field(ImageType, reference=graphene.String(),
                           architecture=graphene.String(), id=graphene.String())
    images = graphene.List(ImageType, is_installed=graphene.Boolean(),
                           is_operation=graphene.Boolean())
    keypair = graphene.Field(KeyPairType, domain_name=graphene.String(),
                             access_key=graphene.String())
    keypairs = graphene.List(KeyPairType, domain_name=graphene.String(),
                             email=graphene.String(), is_active=graphene.Boolean())
    keypair_list = graphene.Field(
        KeyPairList, limit=graphene.Int(required=True), offset=graphene.Int(required=True),
        filter=graphene.String(), order=graphene.String(), domain_name=graphene.String(),
        email=graphene.String(), is_active=graphene.Boolean())
    keypair_resource_policy = graphene.Field(KeyPairResourcePolicyType, name=graphene.String())
    keypair_resource_policies = graphene.List(KeyPairResourcePolicyType)
    resource_preset = graphene.Field(ResourcePresetType, name=graphene.String(),
                                     id=graphene.String())
    resource_presets = graphene.List(ResourcePresetType, scaling_group=graphene.String())
    customized_images = graphene.List(ImageType)

    def resolve_compute_session(root, info, id):
        return visible_sessions(info).filter(pk=id).first()

    def resolve_compute_session_node(root, info, id, **_scope):
        """The session a global id names (the SDK's detail); null for one the asker may
        not see, as compute_session."""
        session_id = uuid_of(id)
        if session_id is None:
            raise GraphQLError(f"Not a session's global id: {id[1]!r}.")
        return visible_sessions(info).prefetch_related("mounts").filter(pk=session_id).first()

    def resolve_compute_session_list(root, info, limit, offset, filter=None, order=None,
                                     domain_name=None, group_id=None, access_key=None,
                                     status=None):
        _no_filter(filter)
        sessions = visible_sessions(info)
        if status:
            sessions = sessions.filter(status__in=_names(status))
        if access_key:
            sessions = sessions.filter(keypair_id=access_key)
        if domain_name:
            sessions = sessions.filter(domain__name=domain_name)
        if group_id:  # a project's id here is a number, not the manager's UUID
            sessions = sessions.filter(project_id=group_id) if group_id.isdigit() \
                else sessions.none()
        sessions = _ordered(sessions, order, SESSION_ORDER)
        return _page(sessions, limit, offset)

    def resolve_agent(root, info, agent_id):
        _require_admin(info, "agents")
        return Agent.objects.filter(pk=agent_id).first()

    def resolve_agents(root, info, scaling_group=None, status=None):
        _require_admin(info, "agents")
        return _agents(scaling_group, status).order_by("id")

    def resolve_agent_list(root, info, limit, offset, filter=None, order=None,
                           scaling_group=None, status=None):
        _require_admin(info, "agents")
        _no_filter(filter)
        agents = _ordered(_agents(scaling_group, status).order_by("id"), order, AGENT_ORDER)
        return _page(agents, limit, offset)

    def resolve_image(root, info, reference=None, architecture=None, id=None):
        images = _images(info)
        if id is not None:
            return images.filter(pk=id).first() if str(id).isdigit() else None
        if reference is None:
            raise GraphQLError("Give the image's reference (with its architecture) or id.")
        images = images.filter(name=reference)
        if architecture:
            images = images.filter(architecture=architecture)
        return images.first()

    def resolve_images(root, info, is_installed=None, is_operation=None):
        # Every image here is installed on an agent (agents report them) and none is an
        # "operation" image: is_operation asks for those only.
        if is_operation or is_installed is False:
            return Image.objects.none()
        return _images(info).order_by("name", "architecture")

    def resolve_keypair(root, info, domain_name=None, access_key=None):
        own = acting_keypair(_request(info))
        if not access_key or access_key == own.access_key:
            return visible_keypairs(info).filter(pk=own.pk).first()
        return visible_keypairs(info).filter(pk=access_key).first()

    def resolve_keypairs(root, info, domain_name=None, email=None, is_active=None):
        keypairs = _by_email(visible_keypairs(info), email)
        if is_active is not None:
            keypairs = keypairs.filter(is_active=is_active)
        return keypairs.order_by("created_at", "access_key")

    def resolve_keypair_list(root, info, limit, offset, filter=None, order=None,
                             domain_name=None, email=None, is_active=None):
        _no_filter(filter)
        keypairs = _by_email(visible_keypairs(info), email)
        if is_active is not None:
            keypairs = keypairs.filter(is_active=is_active)
        keypairs = _ordered(keypairs.order_by("created_at", "access_key"), order,
                            KEYPAIR_ORDER)
        return _page(keypairs, limit, offset)


    def resolve_keypair_resource_policy(root, info, name=None):
        """The named policy (users: only one of their own keypairs'), or the asker's."""
        if name is None:
            return acting_keypair(_request(info)).resource_policy
        return visible_policies(info).filter(name=name).first()

    def resolve_keypair_resource_policies(root, info):
        return visible_policies(info).order_by("name")

    def resolve_resource_preset(root, info, name=None, id=None):
        presets = ResourcePreset.objects.select_related("scaling_group")
        if id is not None:
            return presets.filter(pk=id).first() if uuid_of(("", id)) else None
        if name is None:
            raise GraphQLError("Give the preset's name or id.")
        return presets.filter(name=name).first()

    def resolve_resource_presets(root, info, scaling_group=None):
        presets = ResourcePreset.objects.select_related("scaling_group")
        if scaling_group:
            presets = presets.filter(Q(scaling_group__isnull=True)
                                     | Q(scaling_group__name=scaling_group))
        return presets.order_by("name")

    def resolve_customized_images(root, info):
        # Images made from a user's session (the owner label Backend.AI's commit sets).
        images = Image.objects.filter(labels__has_key=CUSTOMIZED_OWNER_LABEL)
        if not _is_admin(info):
            images = images.filter(**{f"labels__{CUSTOMIZED_OWNER_LABEL}":
                                      f"user:{_request(info).user.pk}"})
        return images.order_by("name")


CUSTOMIZED_OWNER_LABEL = "ai.backend.customized-image.owner"


def visible_policies(info):
    """Every resource policy for admins; a user's: those of their keypairs."""
    policies = ResourcePolicy.objects.all()
    if not _is_admin(info):
        policies = policies.filter(keypair__user=_request(info).user).distinct()
    return policies


def _agents(scaling_group, status):
    agents = Agent.objects.select_related("scaling_group")
    if scaling_group:
        agents = agents.filter(scaling_group__name=scaling_group)
    if status:
        agents = agents.filter(status__in=_names(status))
    return agents


schema = graphene.Schema(query=Query, mutation=Mutation, auto_camelcase=False)


# -- the endpoint ------------------------------------------------------------------------

class _SchemaView(GraphQLView):
    """graphene-django's view: parsing, validation, execution and the {"data", "errors"}
    envelope. Queries only (no mutations exist); no GraphiQL page."""

    graphiql = False


_execute = _SchemaView.as_view(schema=schema)


@extend_schema(exclude=True)  # GraphQL has a schema of its own, not an OpenAPI one
class GraphQLEndpoint(APIView):
    """POST /admin/gql: authenticated, permitted and throttled as every Backend.AI route (the
    keypair signature, or a browser session), then answered by graphene-django. Failures
    before the query runs are answered in GraphQL's envelope too, never as an HTML page."""

    parser_classes = []  # graphene reads the body itself

    def post(self, request):
        plain = request._request
        plain.user, plain.auth = request.user, request.auth
        actor_of(request)  # resolved once, kept on the request graphene's resolvers see
        return _execute(plain)

    get = post

    def handle_exception(self, exc):
        response = super().handle_exception(exc)
        if isinstance(exc, exceptions.APIException):
            detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
            response.data = {"errors": [{"message": detail}],
                             **error_body(response.status_code, detail)}
        return response
