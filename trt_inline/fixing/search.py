"""The search: a small set of candidates for which a test passes, by adaptive group testing.

``passes(chosen)`` compiles with ``chosen`` changed (kept in fp32, or run in PyTorch) and says whether every case
is then within tolerance; it holds for every candidate and not for none. :func:`search` finds the needed
candidates one at a time, last first: the shortest prefix of the candidates left that passes together with what
was found ends in a needed one (without it the prefix does not pass), which is kept; the search goes on in the
prefix before it until what was found passes alone. A needed candidate is often right before the last one found
(the nodes of one precision-sensitive spot are neighbours in graph order), so each round asks about that one
first, then bisects.

Its one assumption: keeping more nodes in fp32 never makes a case worse (``passes`` is monotone). Under it every
candidate found is needed given the others (each was the end of a prefix that did not pass without it, and
the others lie inside that prefix), so the set cannot be made smaller by leaving one out. With k needed among n
candidates it asks about k·(log2 n + 2) + 1 sets, where a prefix bisection in the style of Polygraphy's ``debug
precision`` asks about log2 n and reports a prefix of the graph instead of a set.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["search"]


def search(candidates: Sequence[str], passes: Callable[[Sequence[str]], bool]) -> list[str]:
    """A set of ``candidates`` for which ``passes`` holds, none of which can be left out, in candidate order.

    ``passes`` holds for all of them (the caller checked); it may be asked about the same set twice (the caller
    remembers its answers).
    """
    found: list[str] = []
    rest = list(candidates)  # invariant: found + rest passes
    while rest and not passes(found):
        # The shortest prefix of rest that passes with found: rest[:0] does not, rest[:len(rest)] does.
        low, high = 1, len(rest)
        if high > 1:
            if passes(found + rest[: high - 1]):
                high -= 1
            else:
                low = high  # (the last one is needed: the neighbour of the last one found, most often)
        while low < high:
            middle = (low + high) // 2
            if passes(found + rest[:middle]):
                high = middle
            else:
                low = middle + 1
        found.append(rest[low - 1])
        rest = rest[: low - 1]
    order = {name: index for index, name in enumerate(candidates)}
    return sorted(found, key=order.__getitem__)
