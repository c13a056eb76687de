"""One validated create request, whatever asked for it (the API, the dashboard's form, the
Backend.AI SDK's body), with one set of limits; and the one family of domain errors that each
interface turns into its own answer (DRF's, Backend.AI's JSON, form errors).

An interface maps its input's names and shapes to SessionSpec.build's fields and nothing
more: every limit is here, from settings (Limits) and the keypair's resource policy.
"""

import re
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import connection

from agents_app.models import Agent, AgentStatus, Image, resource_limits
from common.devices import (
    RESERVED_ENVIRONMENT,
    RESERVED_ENVIRONMENT_PREFIXES,
    SHARES,
    WHOLE,
    check_request,
    device_part,
    kind_of,
)
from common.slots import ResourceSlots, SlotError, format_bytes, humanize
from identity_app.models import Project, default_project
from scheduling_app.models import ScalingGroup
from sessions_app.enums import ClusterMode, SessionType
from storage_app.folders import FolderError, resolve_mounts

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
DEFAULT_RESOURCES = {"cpu": "1", "mem": "256m"}
MAX_IMAGE_LENGTH = 255
MAX_TAG_LENGTH = 64
MAX_SECONDS = 2**31 - 1  # what the database's integer columns hold


class DomainError(Exception):
    """A request the domain refuses: `message` says why (to the user), `field` where (a
    SessionSpec field, or None), `status_code` what kind (400 bad input, 404 not there,
    409 conflicts with the current state, 429 over a limit of the policy)."""

    status_code = 400
    problem = title = None  # Backend.AI's error type and title, when not the status's

    def __init__(self, message, field=None, status_code=None, *, errors=None):
        super().__init__(message)
        self.message, self.field = message, field
        # Every field that is wrong, {field: message}; a form shows each at its field.
        self.errors = errors or ({field: message} if field else {})
        if status_code is not None:
            self.status_code = status_code


class DestroyRefused(DomainError):
    """A destroy the rules refuse (sessions_app.lifecycle.destroy), or a PRE_DESTROY_HOOK.
    `message` is what the caller is told; `rule` the refusal's words alone (without when
    the status times out), to group refusals by."""

    status_code = 409

    def __init__(self, message, status_code=None, *, rule=None):
        super().__init__(message, status_code=status_code)
        self.rule = rule or message


class SessionRequestError(DomainError):
    """A request that cannot become a session (or a rename that cannot be made)."""


@dataclass(frozen=True)
class Limits:
    """The bounds of a create request that do not depend on the keypair's policy."""

    max_cluster_size: int
    max_grace_period: int
    max_batch_timeout: int

    @classmethod
    def current(cls):
        return cls(max_cluster_size=settings.MAX_CLUSTER_SIZE,
                   max_grace_period=settings.MAX_GRACE_PERIOD,
                   max_batch_timeout=MAX_SECONDS)


def validate_name(name):
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise SessionRequestError(
            "A session name is 1 to 64 letters, digits, '.', '_' or '-', starting with a letter "
            "or digit.", "name")
    return name


def whole_number(value, name, low, high, *, optional=True):
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SessionRequestError(f"{name} must be a whole number from {low} to {high}.", name)
    return value


def text(value, name, *, max_length=None):
    if value is None:
        return ""
    if not isinstance(value, str):
        raise SessionRequestError(f"{name} must be text.", name)
    if max_length is not None and len(value) > max_length:
        raise SessionRequestError(f"{name} is at most {max_length} characters.", name)
    return value


ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
MAX_ENVIRON_COUNT = 128
MAX_ENVIRON_VALUE = 32768
# Names the kernel runtime sets itself (agents_app.runtime.docker_backend): a user's value
# would change how the session runs, not just what its program sees.
RESERVED_ENV_PREFIXES = ("BACKENDAI_", "TINI_")
RESERVED_ENV_NAMES = frozenset({"HOME", "PATH", "HOSTNAME", "LD_PRELOAD", "LD_LIBRARY_PATH",
                                "USER", "LOGNAME", "SHELL", "PWD"})
MAX_BOOTSTRAP_LENGTH = 65536


def reserved_env_name(name):
    return (name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES)
            or name in RESERVED_ENVIRONMENT or name.startswith(RESERVED_ENVIRONMENT_PREFIXES))


def check_environ(environ):
    """User environment variables for the kernels: {NAME: text}, names as the shell
    allows, none of the names the runtime reserves."""
    if environ is None:
        return {}
    if not isinstance(environ, dict):
        raise SessionRequestError("environ must be an object of variable names to values.",
                                  "environ")
    if len(environ) > MAX_ENVIRON_COUNT:
        raise SessionRequestError(f"environ holds at most {MAX_ENVIRON_COUNT} variables.",
                                  "environ")
    bad = [name for name in environ
           if not isinstance(name, str) or not ENV_NAME_PATTERN.match(name)]
    if bad:
        raise SessionRequestError(
            f"Not a variable name: {', '.join(map(repr, bad[:5]))} (letters, digits and "
            "'_', not starting with a digit).", "environ")
    reserved = sorted(name for name in environ if reserved_env_name(name))
    if reserved:
        raise SessionRequestError(
            f"Reserved environment variable names: {', '.join(reserved)} (the runtime sets "
            f"{', '.join(sorted(RESERVED_ENV_NAMES))}, every BACKENDAI_* and TINI_* name, "
            f"and the device plugins {', '.join(sorted(RESERVED_ENVIRONMENT))} and "
            "CUDA_DEVICE_MEMORY_LIMIT*).", "environ")
    values = {}
    for name, value in environ.items():
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise SessionRequestError(f"The value of {name} must be text.", "environ")
        value = str(value)
        if len(value) > MAX_ENVIRON_VALUE or "\0" in value:
            raise SessionRequestError(f"The value of {name} is at most {MAX_ENVIRON_VALUE} "
                                      "characters, without NUL.", "environ")
        values[name] = value
    return values


def check_priority(priority, policy, may_raise):
    """The priority a request may have: default the policy's; up to it for users, up to
    the policy's maximum for admins (`may_raise`)."""
    if priority is None:
        return policy.default_priority
    highest = policy.max_priority if may_raise else policy.default_priority
    if isinstance(priority, bool) or not isinstance(priority, int) or not (
            0 <= priority <= highest):
        who = "" if may_raise else " (only an admin may set it higher)"
        raise SessionRequestError(
            f"priority must be a whole number from 0 to {highest}, the highest your resource "
            f"policy {policy.name!r} allows{who}.", "priority")
    return priority


def check_designated_agents(agent_ids, group):
    """Agents a session is placed on (any one of them, or for a multi-node session each
    kernel on one of them): known agents of its scaling group."""
    if not isinstance(agent_ids, list | tuple) or not agent_ids or \
            not all(isinstance(a, str) and a for a in agent_ids):
        raise SessionRequestError("agentList is a list of agent ids.", "agent_list")
    known = set(Agent.objects.filter(pk__in=agent_ids, scaling_group=group)
                .exclude(status=AgentStatus.TERMINATED).values_list("pk", flat=True))
    unknown = sorted(set(agent_ids) - known)
    if unknown:
        raise SessionRequestError(f"No such agent in scaling group {group.name}: "
                                  f"{', '.join(unknown)}.", "agent_list")
    return agent_ids


def parse_slots(resources):
    try:
        slots = ResourceSlots.parse(resources or DEFAULT_RESOURCES, allow_zero=False)
        check_request(slots)  # whole devices in whole numbers, shares in quanta
    except SlotError as exc:
        raise SessionRequestError(str(exc), "resources") from None
    return slots


def offered_slots(group=None):
    """The slots a session of `group` may ask for: cpu, mem, and what its agents report
    (their devices' slots among them); of every group's agents without `group`."""
    agents = Agent.objects.exclude(status=AgentStatus.TERMINATED)
    if group is not None:
        agents = agents.filter(scaling_group=group)
    names = {"cpu", "mem"}
    if connection.vendor == "postgresql":  # the keys only, not every agent's JSON
        sql, params = agents.values("available_slots").query.sql_with_params()
        with connection.cursor() as cursor:
            cursor.execute("SELECT DISTINCT jsonb_object_keys(available_slots) "
                           f"FROM ({sql}) AS agents", params)
            names.update(name for (name,) in cursor.fetchall())
        return names
    for available in agents.values_list("available_slots", flat=True):
        names.update(available or {})
    return names


def check_slot_names(slots, group, offered):
    """Every slot asked for is one the group's agents offer; else a 400 naming those."""
    unknown = sorted(set(slots) - offered)
    if not unknown:
        return slots
    message = (f"Unknown resource slot{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}:"
               f" the agents of scaling group {group.name} offer {', '.join(sorted(offered))}.")
    whole_only = sorted({kind_of(name) for name in unknown if name.endswith(SHARES)
                         and f"{kind_of(name)}{WHOLE}" in offered})
    if whole_only:
        message += (f" They offer whole {', '.join(whole_only)} devices only (ask for "
                    f"{', '.join(kind + WHOLE for kind in whole_only)}).")
    raise SessionRequestError(message, "resources")


def check_image_owner(image, user_id):
    """A session's image may be one committed from its owner's session, not another
    user's (sessions_app/commits.py)."""
    images = Image.objects.filter(name=image)
    if images.exists() and not images.usable_by(user_id).exists():
        raise SessionRequestError(f"There is no image {image!r} you may use: it was "
                                  "committed from another user's session.", "image")


def fit_to_image(slots, resources, image, group=None, offered=None):
    """Each kernel's slots on `image`, held to the minimum and maximum its labels declare
    (ai.backend.resource.min.* / .max.*), as Backend.AI's manager holds them: cpu and mem
    that the request leaves out are the image's minimum where that is more, and so are the
    devices of a kind the image needs when the request names none of that kind. An image
    that needs a kind of device that no agent of the scaling group offers is refused. A
    device minimum counts the kind's devices and shares alike (1 device, 1.0 shares)."""
    labels = Image.objects.filter(name=image).values_list("labels", flat=True).first()
    minimum, maximum = resource_limits(labels)
    given = resources if isinstance(resources, dict) else {}
    slots = ResourceSlots(slots)
    for name in ("cpu", "mem"):
        if name in minimum and name not in given:
            slots[name] = max(slots.get(name, 0), minimum[name])
    needed = device_part(minimum)
    if needed and offered is not None:
        kinds = {kind_of(name) for name in offered if kind_of(name)}
        lacking = sorted({kind_of(name) for name in needed} - kinds)
        if lacking:
            raise SessionRequestError(
                f"The image {image} needs {' and '.join(lacking)} devices (at least "
                f"{humanize(needed)}), which no agent of scaling group {group.name} offers.",
                "resources")
    asked_kinds = {kind_of(name) for name in device_part(slots)}
    for name, least in needed.items():
        if kind_of(name) not in asked_kinds:
            slots[name] = least
    below = [name for name, least in sorted(minimum.items())
             if _amount(slots, name) < least]
    if below:
        raise SessionRequestError(
            f"Your resource request is smaller than the minimum required by the image "
            f"{image} ({humanize(minimum)}): {asked(slots, below)}.", "resources")
    above = [name for name, most in sorted(maximum.items()) if slots.get(name, 0) > most]
    if above:
        raise SessionRequestError(
            f"Your resource request is larger than the maximum allowed by the image "
            f"{image} ({humanize(maximum)}): {asked(slots, above)}.", "resources")
    return slots


def asked(slots, names):
    """"mem 128 MiB asked" for each slot named."""
    amounts = {name: slots.get(name, 0) for name in names}
    return ", ".join(f"{name} {format_bytes(value) if name == 'mem' else value} asked"
                     for name, value in amounts.items())


def _amount(slots, name):
    """How much of `name` a request has; for a device slot, of its kind's two slots."""
    kind = kind_of(name)
    if kind is None:
        return slots.get(name, 0)
    return slots.get(kind + WHOLE, 0) + slots.get(kind + SHARES, 0)


@dataclass(frozen=True)
class SessionSpec:
    name: str
    image: str
    scaling_group: ScalingGroup
    project: Project
    slots: ResourceSlots  # per kernel
    priority: int
    session_type: str = SessionType.INTERACTIVE
    cluster_size: int = 1
    cluster_mode: str = ClusterMode.SINGLE_NODE
    startup_command: str = ""
    bootstrap_script: str = ""
    environ: dict = field(default_factory=dict)
    grace_period: int | None = None
    batch_timeout: int | None = None
    tag: str = ""
    pre_stop_command: str = ""
    preemptible: bool = False
    dependencies: tuple = field(default_factory=tuple)
    mounts: tuple = field(default_factory=tuple)  # (folder, path in the kernels, mode)
    not_before: datetime | None = None  # Backend.AI's starts_at
    designated_agents: tuple = field(default_factory=tuple)  # Backend.AI's agentList

    @classmethod
    def build(cls, *, keypair, may_raise_priority=False, name=None, image=None,
              session_type=SessionType.INTERACTIVE, resources=None, cluster_size=1,
              cluster_mode=ClusterMode.SINGLE_NODE, startup_command="",
              scaling_group="default", grace_period=None, batch_timeout=None, tag="",
              project=None, pre_stop_command="", dependencies=(), priority=None,
              preemptible=False, mounts=None, bootstrap_script="", environ=None,
              not_before=None, designated_agents=()):
        """The spec of these fields for `keypair`, or one SessionRequestError naming every
        field that is wrong (`errors`; `field` is the first). `dependencies` are sessions,
        already found among those the requester sees; `may_raise_priority` is for admins.
        `not_before` (a batch session's earliest start) and `designated_agents` (ids of
        agents of its scaling group it must run on; the interface lets only admins name
        them) are Backend.AI's starts_at and agentList."""
        limits, policy, errors = Limits.current(), keypair.resource_policy, {}

        def check(validate, *args, **kwargs):
            try:
                return validate(*args, **kwargs)
            except SessionRequestError as exc:
                errors.setdefault(exc.field, exc.message)
                return None

        check(validate_name, name)
        image = (check(text, image, "image", max_length=MAX_IMAGE_LENGTH) or "").strip()
        if not image:
            errors.setdefault("image", "An image name is required, such as "
                                       f"{settings.DEFAULT_KERNEL_IMAGE}.")
        else:
            check(check_image_owner, image, keypair.user_id)
        if session_type not in SessionType.values:
            errors["session_type"] = (
                f"session_type must be one of {', '.join(SessionType.values)}.")
        group = ScalingGroup.objects.filter(name=scaling_group, is_active=True).first() \
            if isinstance(scaling_group, str) else None
        offered = offered_slots(group) if group is not None else None
        slots = check(parse_slots, resources)
        if slots is not None and image:
            slots = check(fit_to_image, slots, resources, image, group, offered)
        if slots is not None and offered is not None:
            slots = check(check_slot_names, slots, group, offered)
        check(whole_number, cluster_size, "cluster_size", 1, limits.max_cluster_size,
              optional=False)
        if cluster_mode not in ClusterMode.values:
            errors["cluster_mode"] = (
                f"cluster_mode must be one of {', '.join(ClusterMode.values)}.")
        check(whole_number, grace_period, "grace_period", 0, limits.max_grace_period)
        check(whole_number, batch_timeout, "batch_timeout", 1, limits.max_batch_timeout)
        startup_command = check(text, startup_command, "startup_command")
        bootstrap_script = check(text, bootstrap_script, "bootstrap_script",
                                 max_length=MAX_BOOTSTRAP_LENGTH)
        environ = check(check_environ, environ)
        if session_type == SessionType.BATCH and not startup_command:
            errors.setdefault("startup_command", "A batch session needs a startup command.")
        if group is None:
            errors["scaling_group"] = (
                f"There is no active scaling group named {scaling_group!r}.")
        if not isinstance(preemptible, bool):
            errors["preemptible"] = "preemptible must be true or false."
        tag = check(text, tag, "tag", max_length=MAX_TAG_LENGTH)
        pre_stop_command = check(text, pre_stop_command, "pre_stop_command")
        priority = check(check_priority, priority, policy, may_raise_priority)
        if not_before is not None and session_type != SessionType.BATCH:
            errors["starts_at"] = "starts_at is only for batch sessions."
        if designated_agents and group is not None:
            check(check_designated_agents, designated_agents, group)
        if errors:
            first = next(iter(errors))
            raise SessionRequestError(" ".join(errors.values()), first, errors=errors)
        try:  # the owner's folders (another user's is not there: 404)
            folders = resolve_mounts(mounts, user=keypair.user, scaling_group=group)
        except FolderError as exc:
            raise SessionRequestError(exc.message, "mounts", exc.status_code) from None
        return cls(
            name=name, image=image, scaling_group=group, project=project or default_project(),
            slots=slots, priority=priority, session_type=session_type,
            cluster_size=cluster_size, cluster_mode=cluster_mode,
            startup_command=startup_command, grace_period=grace_period,
            bootstrap_script=bootstrap_script, environ=environ,
            batch_timeout=batch_timeout, tag=tag, pre_stop_command=pre_stop_command,
            preemptible=preemptible or policy.preemptible, dependencies=tuple(dependencies),
            mounts=tuple(folders), not_before=not_before,
            designated_agents=tuple(designated_agents or ()))
