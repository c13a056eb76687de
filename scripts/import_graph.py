"""The project's import graph in figures: import cycles, imports that run up the layers,
function-local imports, modules over 400 lines, and each app's share of the code.

    .venv/bin/python scripts/import_graph.py           # a table to read
    .venv/bin/python scripts/import_graph.py --json    # the same figures as JSON

Standard library only (ast): it reads the source and runs none of it. The layers it ranks
are the project's rules: tests/test_layering.py enforces them with `imports` and
`violation` from here, so the figures and the test cannot disagree.

Layers, lowest first (a module may import its own layer and those below):
- common: plumbing with no app (clock, bulk writes, resource slots); imports no app.
- project: backendai_web's settings, Celery app, metrics counters, logs; imports no app.
- domain: each app's models, querysets, specs, events, the agent runtime, storage rules.
- the domain core, ranked: the state engine (transitions, events, bulk writes; it calls no
  agent) < the scheduler and its plugins < the lifecycle (decisions into agent calls and
  network claims) < idle culling and the periodic tasks.
- interfaces: each app's api/, compat/, web/, realtime/ and backendai_web.metrics_view;
  the admin (every app's admin.py and
  the shared admin actions); management commands.
- top: backendai_web.urls and asgi, which wire the interfaces.
Interfaces import one another only along INTERFACE_EDGES; no domain module reaches an
interface.
"""

import argparse
import ast
import json
import sys
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPS = ("sessions_app", "agents_app", "scheduling_app", "storage_app", "identity_app",
        "accounting_app")
PACKAGES = ("common", "backendai_web", *APPS)
INTERFACES = ("api", "compat", "web", "realtime")
# The operations code's own interface: the system-wide /metrics (in the API's error form).
PROJECT_INTERFACES = {"backendai_web.metrics_view": "api"}
LONG = 400

# The domain core's ranks: the first prefix a module name starts with decides.
CORE = (
    ("sessions_app.engine", "engine"),
    ("scheduling_app.scheduler", "scheduler"),
    ("sessions_app.lifecycle", "lifecycle"),
    # Agent calls and warm-network claims: only the lifecycle (and above) makes them.
    ("agents_app.rpc", "lifecycle"),
    ("agents_app.network_pool", "lifecycle"),
    # Session actions that go through an agent, and the freeze that ends sessions.
    ("sessions_app.commits", "lifecycle"),
    ("sessions_app.tools", "lifecycle"),
    ("sessions_app.manager_state", "lifecycle"),
    ("scheduling_app.idle", "periodic"),
    ("scheduling_app.beat", "periodic"),
)
# Each app's Celery tasks (thin, over the layers below) and its AppConfig (which connects
# the layers when Django loads) sit with the periodic tasks, at the top of the domain.
TOP_OF_DOMAIN = ("tasks", "apps")
RANK = {name: rank for rank, name in enumerate(
    ("common", "project", "domain", "engine", "scheduler", "lifecycle", "periodic",
     "interface", "top"))}
# compat answers in the API's error form and streams with realtime; realtime's SSE errors
# use the API's error form. Nothing else crosses between interfaces.
INTERFACE_EDGES = {("compat", "api"), ("compat", "realtime"), ("realtime", "api")}
# Django's app loading: AppConfig.ready registers the API's schema extension.
ALLOWED = {("sessions_app.apps", "sessions_app.api.schema")}


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    local: bool  # inside a function: runs when called, not when the module loads


def _within(module, prefix):
    return module == prefix or module.startswith(prefix + ".")


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
    for prefix, layer in CORE:
        if _within(module, prefix):
            return layer, None
    if parts[0] in APPS and parts[1:] and parts[1] in TOP_OF_DOMAIN:
        return "periodic", None
    return "domain", None


def violation(importer, imported):
    """Why `importer` may not import `imported`, or None."""
    if (importer, imported) in ALLOWED:
        return None
    (low, low_kind), (high, high_kind) = layer_of(importer), layer_of(imported)
    if RANK[high] > RANK[low]:
        return f"a module of the {low} layer imports the {high} layer"
    if low == high == "interface" and low_kind != high_kind \
            and (low_kind, high_kind) not in INTERFACE_EDGES:
        return f"the {low_kind} interface imports the {high_kind} interface"
    return None


def modules(root=ROOT):
    """{dotted name: path} of every project module (not tests, migrations or scripts)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root)
            if "migrations" in relative.parts:
                continue
            found[".".join(relative.with_suffix("").parts).removesuffix(".__init__")] = path
    return found


def _resolve(module, name, known):
    """`from module import name`: the submodule when name is one, else the module."""
    candidate = f"{module}.{name}"
    return candidate if candidate in known else module


def imports_of(module, tree, known=None):
    """Every project import in one parsed module, module-level and function-local."""
    known = known if known is not None else modules()
    found = {}  # `from m import a, b` is one import of m

    def visit(node, local):
        for child in ast.iter_child_nodes(node):
            inside = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                 ast.Lambda))
            if isinstance(child, ast.ImportFrom) and child.module and not child.level:
                if child.module.split(".")[0] in PACKAGES:
                    found.update(dict.fromkeys(
                        Import(module, _resolve(child.module, alias.name, known),
                               child.lineno, inside) for alias in child.names))
            elif isinstance(child, ast.Import):
                found.update(dict.fromkeys(Import(module, alias.name, child.lineno, inside)
                                           for alias in child.names
                                           if alias.name.split(".")[0] in PACKAGES))
            visit(child, inside)

    visit(tree, False)
    return list(found)


def imports(root=ROOT):
    """Every project import of every project module."""
    known = modules(root)
    for module, path in known.items():
        yield from imports_of(module, ast.parse(path.read_text(), str(path)), known)


def cycles(edges):
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    graph = defaultdict(set)
    for importer, imported in edges:
        if importer != imported:
            graph[importer].add(imported)
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


def _interface_module(module):
    return layer_of(module)[0] == "interface"


def figures(root=ROOT):
    known = modules(root)
    every = list(imports(root))
    lines = {module: len(path.read_text().splitlines()) for module, path in known.items()}
    components = cycles((i.importer, i.imported) for i in every if i.imported in known)
    members = {module: n for n, component in enumerate(components) for module in component}
    total = sum(lines.values())
    shares = []
    for package in PACKAGES:
        mine = {m: n for m, n in lines.items() if m.split(".")[0] == package}
        interface = sum(n for m, n in mine.items() if _interface_module(m))
        shares.append({"app": package, "lines": sum(mine.values()),
                       "share": round(100 * sum(mine.values()) / total, 1),
                       "interface_lines": interface})
    local = [i for i in every if i.local]
    return {
        "modules": len(known),
        "lines": total,
        "cycles": [{"modules": component,
                    "edges": [asdict(i) for i in every
                              if members.get(i.importer, -1) == n
                              and members.get(i.imported, -2) == n]}
                   for n, component in enumerate(components)],
        "upward": [dict(asdict(i), why=why) for i in every
                   if (why := violation(i.importer, i.imported))],
        "function_local": {"count": len(local),
                           "by_module": dict(sorted(Counter(i.importer for i in local).items())),
                           "imports": [asdict(i) for i in local]},
        "long_modules": [{"module": m, "lines": n}
                         for m, n in sorted(lines.items(), key=lambda item: -item[1])
                         if n > LONG],
        "apps": shares,
    }


def _table(data):
    out = [f"{data['modules']} modules, {data['lines']} lines", ""]
    out.append(f"import cycles (counting function-local imports): {len(data['cycles'])}")
    for cycle in data["cycles"]:
        out.append("  " + " <-> ".join(cycle["modules"]))
        out.extend(f"    {e['importer']}:{e['line']} -> {e['imported']}"
                   + ("  (in a function)" if e["local"] else "") for e in cycle["edges"])
    out += ["", f"upward imports: {len(data['upward'])}"]
    out.extend(f"  {u['importer']}:{u['line']} -> {u['imported']}"
               + ("  (in a function)" if u["local"] else "") + f"  [{u['why']}]"
               for u in data["upward"])
    local = data["function_local"]
    out += ["", f"function-local imports: {local['count']} in {len(local['by_module'])} modules"]
    out.extend(f"  {module}: {count}" for module, count in local["by_module"].items())
    out += ["", f"modules over {LONG} lines: {len(data['long_modules'])}"]
    out.extend(f"  {m['lines']:5}  {m['module']}" for m in data["long_modules"])
    out += ["", f"  {'app':16}{'lines':>7}{'share':>8}{'interfaces':>12}"]
    out.extend(f"  {a['app']:16}{a['lines']:7}{a['share']:7}%{a['interface_lines']:12}"
               for a in data["apps"])
    return "\n".join(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    data = figures()
    print(json.dumps(data, indent=2) if args.json else _table(data))


if __name__ == "__main__":
    sys.exit(main())
