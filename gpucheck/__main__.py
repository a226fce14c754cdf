"""``python -m gpucheck carry | run | rehearse``: each verb imports only what it needs."""

from __future__ import annotations

import importlib
import sys

VERBS = {"carry": "gpucheck.carry", "run": "gpucheck.run", "rehearse": "gpucheck.rehearsal"}  # verb: module


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in VERBS:
        print(
            f"usage: python -m gpucheck {{{'|'.join(VERBS)}}} [options]  (--help after a verb)",
            file=sys.stderr,
        )
        return 2
    return importlib.import_module(VERBS[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
