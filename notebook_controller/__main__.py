import sys

from .cli import print_manifests, run_controller

if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["manifests"]:
        sys.exit(print_manifests(args[1:]))
    sys.exit(run_controller(args[1:] if args[:1] == ["controller"] else args))
