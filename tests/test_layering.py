"""The layout's rules (ARCHITECTURE.md, "Apps and what each owns"), read from the imports.

Layers, lowest first:
- common: plumbing with no app (clock, bulk writes, resource slots); imports no app.
- project: backendai_web's settings, Celery app, metrics counters, logs; imports no app.
- domain: each app's models, engine, lifecycle, scheduler, agent runtime, tasks.
- interfaces: each app's api/, compat/, web/, realtime/ and backendai_web.metrics_view;
  the admin (every app's admin.py and the shared admin actions); management commands.
- top: backendai_web.urls and asgi, which wire the interfaces.

A module may import its own layer and those below; interfaces import one another only along
INTERFACE_EDGES; the domain of one app never reaches another app's (or its own) interfaces.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
APPS = ("sessions_app", "agents_app", "scheduling_app", "storage_app", "identity_app")
PACKAGES = ("common", "backendai_web", *APPS)
INTERFACES = ("api", "compat", "web", "realtime")
# The operations code's own interface: the system-wide /metrics (in the API's error form).
PROJECT_INTERFACES = {"backendai_web.metrics_view": "api"}
RANK = {"common": 0, "project": 1, "domain": 2, "interface": 3, "top": 4}
# compat answers in the API's error form and streams with realtime; realtime's SSE errors
# use the API's error form. Nothing else crosses between interfaces.
INTERFACE_EDGES = {("compat", "api"), ("compat", "realtime"), ("realtime", "api")}
# Django's app loading: AppConfig.ready registers the API's schema extension.
ALLOWED = {("sessions_app.apps", "sessions_app.api.schema")}


def layer_of(module):
    """(layer, interface name or None) of a dotted module name."""
    parts = module.split(".")
    if parts[0] == "common":
        return "common", None
    if module in PROJECT_INTERFACES:
        return "interface", PROJECT_INTERFACES[module]
    if parts[0] == "backendai_web":
        return ("top", None) if parts[1:2] in (["urls"], ["asgi"]) else ("project", None)
    if parts[0] in APPS and len(parts) > 1 and parts[1] in INTERFACES:
        return "interface", parts[1]
    if parts[-1] == "admin" or module == "sessions_app.admin_actions":
        return "interface", "admin"
    if "management" in parts:
        return "interface", "command"
    return "domain", None


def violation(importer, imported):
    """Why `importer` may not import `imported`, or None."""
    if (importer, imported) in ALLOWED:
        return None
    (low, low_kind), (high, high_kind) = layer_of(importer), layer_of(imported)
    if RANK[high] > RANK[low]:
        return f"a {low} module imports the {high} layer"
    if low == high == "interface" and low_kind != high_kind \
            and (low_kind, high_kind) not in INTERFACE_EDGES:
        return f"the {low_kind} interface imports the {high_kind} interface"
    return None


def resolve(module, name):
    """`from module import name`: the submodule when name is one, else the module."""
    candidate = f"{module}.{name}"
    path = ROOT / candidate.replace(".", "/")
    return candidate if path.with_suffix(".py").exists() or path.is_dir() else module


def imports():
    for path in sorted(ROOT.glob("*/**/*.py")):
        relative = path.relative_to(ROOT)
        if relative.parts[0] not in PACKAGES or "migrations" in relative.parts:
            continue
        module = ".".join(relative.with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                if node.module.split(".")[0] in PACKAGES:
                    for alias in node.names:
                        yield module, resolve(node.module, alias.name), node.lineno
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] in PACKAGES:
                        yield module, alias.name, node.lineno


def test_no_module_imports_a_layer_above_it():
    found = [f"{importer}:{line} imports {imported}: {why}"
             for importer, imported, line in imports()
             if (why := violation(importer, imported))]
    assert found == []


def test_no_relative_imports_hide_where_a_module_reaches():
    relative = [f"{module}:{line}" for module, line in _relative_imports()]
    assert relative == []


def _relative_imports():
    for path in sorted(ROOT.glob("*/**/*.py")):
        relative = path.relative_to(ROOT)
        if relative.parts[0] not in PACKAGES or "migrations" in relative.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                yield ".".join(relative.parts), node.lineno


@pytest.mark.parametrize("importer, imported", [
    ("sessions_app.engine", "sessions_app.api.errors"),          # domain → interface
    ("scheduling_app.idle", "sessions_app.web.timeline"),        # another app's interface
    ("common.clock", "sessions_app.models"),                     # plumbing → an app
    ("backendai_web.metrics", "sessions_app.models"),            # project → an app
    ("sessions_app.web.views", "sessions_app.compat.views"),     # interface → interface
    ("sessions_app.api.views", "sessions_app.realtime.streams"),  # against the edges
    ("sessions_app.lifecycle.destroy", "backendai_web.urls"),    # domain → top
    ("storage_app.folders", "storage_app.api.views"),           # storage's domain → its API
    ("storage_app.web.views", "storage_app.compat.views"),      # its interfaces
])
def test_the_rules_refuse_what_they_should(importer, imported):
    assert violation(importer, imported)


@pytest.mark.parametrize("importer, imported", [
    ("sessions_app.compat.views", "sessions_app.api.errors"),
    ("agents_app.admin", "sessions_app.admin_actions"),
    ("scheduling_app.idle", "sessions_app.lifecycle.destroy"),
    ("sessions_app.api.views", "common.clock"),
    ("backendai_web.urls", "sessions_app.web.views"),
])
def test_the_rules_allow_what_they_should(importer, imported):
    assert violation(importer, imported) is None
