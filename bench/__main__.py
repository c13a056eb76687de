import importlib
import pkgutil
import sys
from pathlib import Path


def main(argv):
    wanted = argv[1:]
    names = sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)])
                   if m.name.startswith("bench_"))
    # Exact names (`scheduler` is bench_scheduler only; `scheduler_day` the day trace).
    # An OPT_IN benchmark (the soak, which restarts services) runs only when named.
    unknown = [w for w in wanted if f"bench_{w.removeprefix('bench_')}" not in names]
    if unknown:
        print(f"no benchmark named {', '.join(unknown)}; there are: "
              f"{', '.join(n.removeprefix('bench_') for n in names) or 'none'}")
        return 1
    selected = [f"bench_{w.removeprefix('bench_')}" for w in wanted] or [
        n for n in names
        if not getattr(importlib.import_module(f"bench.{n}"), "OPT_IN", False)]
    for name in selected:
        print(f"== {name}", flush=True)
        importlib.import_module(f"bench.{name}").main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
