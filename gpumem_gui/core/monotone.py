"""Searches over monotone predicates: memory never falls as batch, context or bits grow, so the largest value
that fits is found by bisection (a few dozen estimates, not a scan)."""

from __future__ import annotations

from collections.abc import Callable


def largest(pred: Callable[[int], bool], lo: int, hi: int) -> int | None:
    """Largest n in [lo, hi] with pred(n) true, for pred monotone (true, then false).

    None when pred(lo) is already false."""
    if not pred(lo):
        return None
    if pred(hi):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pred(mid):
            lo = mid
        else:
            hi = mid
    return lo


def gallop(pred: Callable[[int], bool], start: int, lo: int, hi: int) -> int | None:
    """Largest n in [lo, hi] with pred(n), pred monotone (true, then false), searching outward from ``start``
    (doubling up, or halving down), then bisecting: few evaluations when the answer is near ``start``."""
    start = min(max(start, lo), hi)
    if pred(start):
        good, bad = start, None
        n = start
        while n < hi:
            n = min(hi, n * 2)
            if pred(n):
                good = n
            else:
                bad = n
                break
        if bad is None:
            return good
    else:
        bad, good = start, None
        n = start
        while n > lo:
            n = max(lo, n // 2)
            if pred(n):
                good = n
                break
            bad = n
        if good is None:
            return None
    while bad - good > 1:
        mid = (good + bad) // 2
        if pred(mid):
            good = mid
        else:
            bad = mid
    return good
