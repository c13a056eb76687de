"""The layout's rules (ARCHITECTURE.md, "Apps and what each owns"), read from the imports.

The layers and their ranks are scripts/import_graph.py's (its docstring lists them): common,
project, domain, then the domain core ranked (the state engine, the scheduler, the
lifecycle, idle culling and the periodic tasks), the interfaces, the top. A module may
import its own layer and those below, at module level or inside a function; interfaces
import one another only along INTERFACE_EDGES; no domain module reaches an interface.
"""

import ast
from pathlib import Path

import pytest

from scripts.import_graph import imports, imports_of, modules, violation


def upward(found):
    """What runs against the layers in these imports, one line each."""
    return [f"{i.importer}:{i.line} imports {i.imported}"
            + (" (in a function)" if i.local else "") + f": {why}"
            for i in found if (why := violation(i.importer, i.imported))]


def test_no_module_imports_a_layer_above_it():
    assert upward(imports()) == []


def test_the_check_catches_an_upward_import_at_module_level_and_inside_a_function():
    path = Path(__file__).with_name("upward_import_fixture.py")
    found = imports_of("sessions_app.engine", ast.parse(path.read_text()), modules())
    assert upward(found) == [
        "sessions_app.engine:5 imports sessions_app.lifecycle.destroy: "
        "a module of the engine layer imports the lifecycle layer",
        "sessions_app.engine:9 imports scheduling_app.idle (in a function): "
        "a module of the engine layer imports the periodic layer",
    ]


def test_no_relative_imports_hide_where_a_module_reaches():
    relative = [f"{module}:{line}" for module, line in _relative_imports()]
    assert relative == []


def _relative_imports():
    for module, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                yield module, node.lineno


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
    # The domain core, ranked.
    ("sessions_app.engine", "scheduling_app.scheduler.core"),   # engine → scheduler
    ("sessions_app.engine", "sessions_app.lifecycle.destroy"),  # engine → lifecycle
    ("sessions_app.engine", "agents_app.rpc"),                  # the engine calls no agent
    ("sessions_app.engine", "agents_app.network_pool"),         # nor claims a network
    ("scheduling_app.scheduler.preemption", "sessions_app.lifecycle.destroy"),
    ("scheduling_app.scheduler.core", "agents_app.rpc"),
    ("sessions_app.lifecycle.heartbeats", "scheduling_app.idle"),  # lifecycle → culling
    ("sessions_app.lifecycle.progress", "scheduling_app.tasks"),
    ("sessions_app.quota", "scheduling_app.scheduler.snapshot"),  # plain domain → scheduler
    ("sessions_app.hooks", "sessions_app.lifecycle"),
    ("sessions_app.models", "sessions_app.engine"),
])
def test_the_rules_refuse_what_they_should(importer, imported):
    assert violation(importer, imported)


@pytest.mark.parametrize("importer, imported", [
    ("sessions_app.compat.views", "sessions_app.api.errors"),
    ("agents_app.admin", "sessions_app.admin_actions"),
    ("scheduling_app.idle", "sessions_app.lifecycle.destroy"),
    ("sessions_app.api.views", "common.clock"),
    ("backendai_web.urls", "sessions_app.web.views"),
    ("scheduling_app.scheduler.core", "sessions_app.engine"),
    ("sessions_app.lifecycle.create", "scheduling_app.scheduler.core"),
    ("sessions_app.lifecycle.destroy", "agents_app.rpc"),
    ("scheduling_app.tasks", "scheduling_app.idle"),
    ("sessions_app.apps", "sessions_app.lifecycle.networks"),
    ("sessions_app.engine", "sessions_app.models"),
])
def test_the_rules_allow_what_they_should(importer, imported):
    assert violation(importer, imported) is None
