"""The background refill of an answer after `HybridCache.invalidate(..., refill=...)`.

It reads the new generations before computing, so that an invalidation while `refill` runs
supersedes what it computes: the put then finds other generations and stores nothing. Whatever
happens, the outcome is counted ("stored", "refused", "empty", "failed") and the request that
invalidated never waits for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cache_runtime.hybrid import HybridCache


def refill_answer(
    cache: HybridCache,
    key: str,
    refill: Callable[[], bytes | None],
    template: str | None,
    put_options: dict[str, Any],
) -> bool:
    """Recompute `key` with `refill` under the current generations and store it in `cache`
    with `put_options`; whether it was stored (False if `refill` raised or gave None)."""
    try:
        stamp = cache.lookup(key, template=template).generations  # before computing
        value = refill()
    except Exception:
        cache.metrics.refills.labels("failed").inc()
        return False
    if value is None:
        cache.metrics.refills.labels("empty").inc()
        return False
    options = {"template": template, "generations": stamp, **put_options}
    stored = stamp is not None and cache.put(key, value, **options)
    cache.metrics.refills.labels("stored" if stored else "refused").inc()
    return stored
