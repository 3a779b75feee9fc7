"""Command line: ``python -m gnnfuse build`` compiles the CPU kernels ahead of first use (for Docker
images, CI caches, clusters whose compute nodes have no compiler); ``python -m gnnfuse info``
prints versions, compiler, threads, build cache and devices."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gnnfuse", description=__doc__)
    commands = parser.add_subparsers(dest="command", metavar="{build,info}")
    build = commands.add_parser("build", help="compile the C++ CPU kernels now (into the build cache) and say where")
    build.add_argument("extensions", nargs="*", help="which ones (default: all)")
    commands.add_parser("info", help="versions, compiler, threads, build cache, devices")
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2

    from . import _build

    if args.command == "info":
        from .explain import show_config

        show_config()
        return 0
    unknown = sorted(set(args.extensions) - set(_build.EXTENSIONS))
    if unknown:
        parser.error(f"unknown extension(s) {', '.join(unknown)}; known: {', '.join(_build.EXTENSIONS)}")
    failed = 0
    for name in args.extensions or list(_build.EXTENSIONS):
        try:
            module = _build.load_extension(name)
        except _build.BuildError as exc:
            print(f"{name}: FAILED: {exc}", file=sys.stderr)
            failed += 1
            continue
        print(f"{name}: {getattr(module, '__file__', '?')}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
