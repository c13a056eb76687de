"""Session templates: Backend.AI's task templates, stored per user and project.

A template is a YAML or JSON document (the manager's `taskTemplate`):

    api_version: v1
    kind: taskTemplate
    metadata: {name: NAME, tag: TAG}
    spec:
      session_type: interactive | batch
      kernel:
        image: IMAGE
        environ: {NAME: VALUE}
        run: {bootstrap: SCRIPT, startup_command: COMMAND}
      resources: {cpu: "1", mem: 256m}
      scaling_group: default
      mounts: {FOLDER: PATH}
      cluster_size: 2                      # optional: kernels of one session
      cluster_mode: single-node            # or multi-node

It is checked when stored (the same rules as a create request, for what can be checked
without creating), kept as sent, and turned into a create request's fields when a session
starts from it; what the request names itself wins over the template.
"""

import json

import yaml

from sessions_app.enums import SessionType
from sessions_app.spec import DomainError, check_environ

KINDS = ("taskTemplate", "task_template")
MAX_PAYLOAD = 65536


class TemplateError(DomainError):
    """A template document that cannot be stored or used."""


def parse_payload(payload):
    """The templates a create or update request carries, as [(name, document)]. The
    payload is YAML or JSON text (or already parsed): one template, a list of them, or the
    manager's `{"session_templates": [{"name", "template"}]}`."""
    body = payload
    if isinstance(payload, str):
        if len(payload) > MAX_PAYLOAD:
            raise TemplateError(f"The payload is at most {MAX_PAYLOAD} characters.", "payload")
        try:
            body = json.loads(payload)
        except ValueError:
            try:
                body = yaml.safe_load(payload)
            except yaml.YAMLError as exc:
                raise TemplateError(f"Malformed payload: neither JSON nor YAML ({exc}).",
                                    "payload") from None
    if isinstance(body, dict) and isinstance(body.get("session_templates"), list):
        items = []
        for entry in body["session_templates"]:
            if not isinstance(entry, dict) or "template" not in entry:
                raise TemplateError("Each of session_templates is {name, template}.",
                                    "payload")
            items.append((entry.get("name"), entry["template"]))
    elif isinstance(body, list):
        # The SDK's documented form: [{"is_active", "type", "name", "template": {...}}],
        # or templates themselves.
        items = [entry_of(item) if isinstance(item, dict) and "template" in item
                 else (None, item) for item in body]
    else:
        items = [(None, body)]
    if not items:
        raise TemplateError("The payload holds no template.", "payload")
    checked = []
    for name, document in items:
        if isinstance(name, str) and name.strip() and isinstance(document, dict):
            # The entry names it: its metadata may leave the name out.
            metadata = document.get("metadata")
            if metadata is None or (isinstance(metadata, dict) and not metadata.get("name")):
                document = {**document, "metadata": {**(metadata or {}), "name": name}}
        template = check_template(document)
        name = name if isinstance(name, str) and name else template["metadata"]["name"]
        checked.append((name[:128], document))
    return checked


def entry_of(item):
    """(name, template) of one entry of the list form; only active task templates are
    stored here (a cluster template is not, and an inactive one is a deleted one)."""
    kind = item.get("type", "task")
    if kind not in ("task", "TASK"):
        raise TemplateError(f"Only task templates are stored here, not {kind!r}: a session's "
                            "kernels all run one image.", "payload")
    if item.get("is_active", True) is not True:
        raise TemplateError("is_active must be true: an inactive template is a deleted one.",
                            "payload")
    return item.get("name"), item["template"]


def _mapping(value, where):
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TemplateError(f"{where} must be a mapping.", "payload")
    return value


def _text(value, where):
    if value is not None and not isinstance(value, str):
        raise TemplateError(f"{where} must be text.", "payload")
    return value or ""


def check_template(document):
    """The template's fields, normalized: {"metadata": {name, tag}, "session_type",
    "image", "environ", "bootstrap", "startup_command", "resources", "scaling_group",
    "mounts": {folder: path or None}}. TemplateError names what is wrong."""
    if not isinstance(document, dict):
        raise TemplateError("A template is a mapping with metadata and spec.", "payload")
    kind = document.get("kind", KINDS[0])
    if kind not in KINDS:
        raise TemplateError(f"kind must be taskTemplate, not {kind!r}.", "payload")
    metadata = _mapping(document.get("metadata"), "metadata")
    name = metadata.get("name")
    if not isinstance(name, str) or not name.strip():
        raise TemplateError("metadata.name is required.", "payload")
    spec = _mapping(document.get("spec"), "spec")
    kernel = _mapping(spec.get("kernel"), "spec.kernel")
    image = _text(kernel.get("image"), "spec.kernel.image").strip()
    if not image:
        raise TemplateError("spec.kernel.image is required.", "payload")
    session_type = next((spec[key] for key in ("session_type", "sessionType", "type")
                         if spec.get(key) is not None), SessionType.INTERACTIVE)
    if session_type not in SessionType.values:
        raise TemplateError(f"spec.session_type must be one of "
                            f"{', '.join(SessionType.values)}.", "payload")
    run = _mapping(kernel.get("run"), "spec.kernel.run")
    startup = next((run[key] for key in ("startup_command", "startupCommand", "startup")
                    if run.get(key) is not None), None)
    environ = check_environ(_mapping(kernel.get("environ"), "spec.kernel.environ"))
    mounts = spec.get("mounts") or {}
    if isinstance(mounts, list):
        mounts = {folder: None for folder in mounts}
    mounts = _mapping(mounts, "spec.mounts")
    if not all(isinstance(k, str) and (v is None or isinstance(v, str))
               for k, v in mounts.items()):
        raise TemplateError("spec.mounts maps folder names to paths.", "payload")
    return {
        "metadata": {"name": name.strip(), "tag": _text(metadata.get("tag"), "metadata.tag")},
        "session_type": session_type, "image": image, "environ": environ,
        "bootstrap": _text(run.get("bootstrap"), "spec.kernel.run.bootstrap"),
        "startup_command": _text(startup, "spec.kernel.run.startup_command"),
        "resources": {str(k): str(v) for k, v in
                      _mapping(spec.get("resources"), "spec.resources").items()},
        "scaling_group": _text(spec.get("scaling_group"), "spec.scaling_group") or None,
        "mounts": mounts,
        "cluster_size": _cluster_size(spec.get("cluster_size")),
        "cluster_mode": _text(spec.get("cluster_mode"), "spec.cluster_mode") or None,
    }


def _cluster_size(value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TemplateError("spec.cluster_size must be a whole number of at least 1.",
                            "payload")
    return value


def as_sdk_request(document):
    """A template as the Backend.AI client's create body (the compat create route's
    input), for create-from-template to lay the request's own values over."""
    template = check_template(document)
    config = {"environ": template["environ"], "resources": template["resources"],
              "mounts": list(template["mounts"]),
              "mount_map": {k: v for k, v in template["mounts"].items() if v}}
    if template["scaling_group"]:
        config["scalingGroup"] = template["scaling_group"]
    request = {"image": template["image"], "type": template["session_type"],
               "tag": template["metadata"]["tag"],
               "startupCommand": template["startup_command"],
               "bootstrap_script": template["bootstrap"], "config": config}
    if template["cluster_size"]:
        request["clusterSize"] = template["cluster_size"]
    if template["cluster_mode"]:
        request["clusterMode"] = template["cluster_mode"]
    return request


def overlay(base, request):
    """`base` with each value the request sets (not None, not empty) laid over it; the
    `config` objects are merged key by key."""
    merged = dict(base)
    for key, value in request.items():
        if value is None or value == "" or value == [] or value == {}:
            continue
        if key == "config" and isinstance(value, dict):
            merged["config"] = overlay(base.get("config") or {}, value)
        else:
            merged[key] = value
    return merged


def form_initial(document):
    """The dashboard create form's initial values from a template."""
    template = check_template(document)
    initial = {"image": template["image"], "session_type": template["session_type"],
               "startup_command": template["startup_command"],
               "mounts": list(template["mounts"])}
    resources = template["resources"]
    if resources.get("cpu"):
        initial["cpu"] = resources["cpu"]
    return initial
