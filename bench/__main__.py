import importlib
import pkgutil
import sys
from pathlib import Path


def main(argv):
    wanted = argv[1:]
    names = sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)])
                   if m.name.startswith("bench_"))
    selected = [n for n in names if not wanted or any(w in n for w in wanted)]
    if not selected:
        print(f"no benchmark matches {wanted}; there are: {', '.join(names) or 'none'}")
        return 1
    for name in selected:
        print(f"== {name}", flush=True)
        importlib.import_module(f"bench.{name}").main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
