"""``python -m gpucheck carry | run | rehearse`` (docs/GPU.md): each verb imports only what it needs, so
``carry`` runs with the standard library and ``run`` with what the lent GPU machine has."""

from __future__ import annotations

import sys

VERBS = ("carry", "run", "rehearse")


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in VERBS:
        print(
            f"usage: python -m gpucheck {{{'|'.join(VERBS)}}} [options]  (--help after a verb)",
            file=sys.stderr,
        )
        return 2
    verb, rest = argv[0], argv[1:]
    if verb == "carry":
        from gpucheck.carry import main as carry

        return carry(rest)
    if verb == "run":
        from gpucheck.run import main as run

        return run(rest)
    from gpucheck.rehearsal import main as rehearse

    return rehearse(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
