import importlib
import pkgutil
import sys
from pathlib import Path


def main(argv):
    wanted = argv[1:]
    names = sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)])
                   if m.name.startswith("bench_"))
    # An OPT_IN benchmark (the soak, which restarts services) runs only when named.
    selected = [n for n in names if any(w in n for w in wanted) if wanted] or \
        [n for n in names if not wanted and not getattr(
            importlib.import_module(f"bench.{n}"), "OPT_IN", False)]
    if not selected:
        print(f"no benchmark matches {wanted}; there are: {', '.join(names) or 'none'}")
        return 1
    for name in selected:
        print(f"== {name}", flush=True)
        importlib.import_module(f"bench.{name}").main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
