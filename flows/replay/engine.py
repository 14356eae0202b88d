"""`preheat replay`: a trace replayed in trace time against the hybrid cache, warm-up on or off.

Each request walks its prompt blocks through the node's `HybridCache`: a block is a usable hit
while every block before it hit (KV prefix semantics), and costs the load from the tier that
held it; from the first miss on, every block is prefilled and written back. Restarts (every
`restart_every_s`) wipe the node's memory and SSD tiers. With warm-up on, after each restart the
worker rehydrates the node from the heat manifest (the past of the trace only), and every
`ahead_every_s` during normal running it warms blocks whose heat predicts demand but that the
node no longer holds; its work takes modelled time, so items arrive progressively. Plans are
sized to what the worker delivers before the demand (`flows.replay.planning`), from a model of
when blocks are asked for again learned on the stream (`flows.replay.demand`).

The restore reference is the same replay where each restart instantly restores the pre-restart
contents — which leaves the cache exactly as if the node had not restarted — so it is run as the
replay without restarts and scored on the same after-restart windows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np

from cache_runtime.keys import PrefixKey
from cache_runtime.policies import Hint
from flows.bench.traces import AccessTrace
from flows.replay.demand import DemandModel
from flows.replay.latency import BLOCK_TOKENS, ReplayLatency
from flows.replay.node import Node, TraceClock
from flows.replay.planning import plan_ahead, plan_warmup
from flows.replay.warming import HeatManifest, WarmWorker

TIERS = ("memory", "ssd", "redis")


@dataclass(frozen=True)
class ReplayConfig:
    """Sizes are fractions of the trace's unique blocks; times are trace seconds."""

    memory: float
    ssd: float
    redis: float = 0.0
    restart_every_s: float | None = None
    window_s: float = 120.0
    warmup: bool = False
    half_life_s: float = 300.0  # the manifest's memory: minutes, the scale of a session
    # Consider a block expected to be asked for at least half a time within the window; which
    # of those are warmed is the plan's cut (`flows.replay.planning`).
    min_expected_uses: float = 0.5
    # Expected warm-up precision each plan is cut to: the mean P(used) of its items, from the
    # `DemandModel` learned on the stream and the worker's modelled delivery times; None warms
    # every deliverable block with a chance of use. 0.6 leaves a margin over the platform's 0.5.
    target_precision: float | None = 0.6
    # No block is warmed that is likelier wasted than used, whatever the plan's mean: the mean
    # of a plan is only as good as its model, and the tail it lets in is where the model errs
    # most (measured on Mooncake, restarts every 300 s, prefill 0.019 ms/token: the last plan's
    # items forecast below 0.5 were 19% used, and without the floor precision fell to 0.49).
    min_use_probability: float = 0.5
    # How long a warmed block can wait for its request (counted used if asked for within it);
    # None: the restart interval (the node's tiers are wiped then), or the window without
    # restarts.
    retention_s: float | None = None
    order_half_life_s: float = 30.0  # what is hot right now (live sessions) is warmed first
    memory_share: float = 0.0  # share of the memory tier rehydrated (the rest goes to the SSD)
    # Ahead-of-demand warming during normal running (None: off). Off by default: on Mooncake it
    # warmed 391 blocks the node had lost and none was used before eviction — a hot block a
    # node loses was evicted for a reason, and restart rehydration is where warm-up pays.
    ahead_every_s: float | None = None
    value_bytes: int = 64

    def __post_init__(self) -> None:
        for name in ("memory", "ssd", "redis"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"--{name} must be a fraction in [0, 1]")
        if self.restart_every_s is not None and self.restart_every_s <= 0:
            raise ValueError("--restart-every must be positive seconds")
        if self.window_s <= 0:
            raise ValueError("--window must be positive seconds")
        if self.ahead_every_s is not None and self.ahead_every_s <= 0:
            raise ValueError("ahead_every_s must be positive seconds (or None: off)")
        if self.target_precision is not None and not 0 < self.target_precision < 1:
            raise ValueError("--target-precision must be in (0, 1), or 0 for no cut")
        if not 0 <= self.min_use_probability < 1:
            raise ValueError("min_use_probability must be in [0, 1)")
        if self.retention_s is not None and self.retention_s <= 0:
            raise ValueError("retention_s must be positive seconds (or None: the default)")

    @property
    def retention(self) -> float:
        """Seconds a warmed block can wait for its request (see `retention_s`)."""
        return self.retention_s or self.restart_every_s or self.window_s


@dataclass
class PreparedTrace:
    """The trace as block indices, with each block's key, parent and tokens."""

    trace: AccessTrace
    blocks: np.ndarray  # (N,) index of each access's block in `keys`
    keys: list[str]  # (U,) cache key of each unique block
    parents: np.ndarray  # (U,) index of the block before it in its chain, -1 at a root
    tokens: np.ndarray  # (U,) prompt tokens in the block
    cohorts: np.ndarray  # (U,) the request that first asked for the block

    @classmethod
    def build(cls, trace: AccessTrace, model_id: str = "replay") -> PreparedTrace:
        unique, blocks = np.unique(trace.accesses, return_inverse=True)
        n = len(trace.accesses)
        starts = np.zeros(n, dtype=bool)
        starts[trace.request_starts] = True
        parent_access = np.where(starts, -1, np.arange(n) - 1)
        parents = np.full(len(unique), -1, dtype=np.int64)
        parents[blocks] = np.where(parent_access >= 0, blocks[np.maximum(parent_access, 0)], -1)
        tokens = np.full(len(unique), BLOCK_TOKENS, dtype=np.int64)
        if trace.tokens is not None:
            tokens[blocks] = trace.tokens
        root_access = np.maximum.accumulate(np.where(starts, np.arange(n), 0))  # (N,)
        depth = np.arange(n) - root_access  # (N,) position of each access in its request
        first_sight = np.unique(blocks, return_index=True)[1]  # (U,) first access of each
        cohorts = (np.cumsum(starts) - 1)[first_sight]
        keys = [""] * len(unique)
        for access in first_sight.tolist():
            block = int(unique[blocks[access]])
            root = block if depth[access] == 0 else int(trace.accesses[root_access[access]])
            keys[blocks[access]] = PrefixKey(
                "trace", model_id, int(depth[access]), block, root
            ).to_string()
        return cls(trace, blocks, keys, parents, tokens, cohorts)


@dataclass
class ArmResult:
    ttft_ms: np.ndarray  # (R,) modelled time to first token of each request
    served: dict[str, int]  # blocks served from each tier (usable prefix hits)
    blocks: int
    restarts: list[float]
    hit_blocks: np.ndarray  # (R,) usable cached blocks of each request
    request_blocks: np.ndarray  # (R,) blocks of each request
    warm: dict[str, float] = field(default_factory=dict)


def _sizes(config: ReplayConfig, unique: int) -> tuple[int, int]:
    return round(config.memory * unique), round(config.ssd * unique)


def replay_arm(
    prepared: PreparedTrace,
    config: ReplayConfig,
    latency: ReplayLatency,
    redis_url: str | None = None,
) -> ArmResult:
    """One replay of the whole trace; see the module docstring for what it models."""
    trace = prepared.trace
    memory_blocks, ssd_blocks = _sizes(config, len(prepared.keys))
    clock = TraceClock()
    node = Node(
        memory_blocks,
        ssd_blocks,
        clock,
        redis_url if config.redis > 0 else None,
        config.value_bytes,
    )
    value = bytes(config.value_bytes)
    manifest = HeatManifest(len(prepared.keys), config.half_life_s)
    recent = HeatManifest(len(prepared.keys), config.order_half_life_s)
    worker = WarmWorker(prepared.keys, prepared.parents, prepared.tokens, latency, value)
    demand = DemandModel(
        config.window_s, config.retention, config.min_expected_uses, groups=prepared.cohorts
    )
    bounds = np.append(trace.request_starts, len(trace.accesses))
    times = trace.times if trace.times is not None else np.arange(len(trace.accesses), dtype=float)
    start_time = float(times[0])
    next_restart = start_time + config.restart_every_s if config.restart_every_s else np.inf
    next_ahead = start_time + config.ahead_every_s if config.ahead_every_s else np.inf
    ttft = np.zeros(len(trace.request_starts))
    hit_blocks = np.zeros(len(trace.request_starts), dtype=np.int64)
    served = dict.fromkeys(TIERS, 0)
    restarts: list[float] = []
    try:
        for r, (first, end) in enumerate(pairwise(bounds.tolist())):
            now = float(times[first])
            clock.now = now
            while now >= next_restart:
                node.restart()
                worker.forget_local()
                restarts.append(next_restart)
                if config.warmup:
                    plan_warmup(
                        worker, node, demand, (manifest, recent), next_restart, config,
                        memory_blocks, ssd_blocks,
                    )  # fmt: skip
                next_restart += config.restart_every_s or np.inf
            if config.warmup:
                if now >= next_ahead:
                    plan_ahead(worker, node, demand, (manifest, recent), now, config, ssd_blocks)
                    next_ahead = now + (config.ahead_every_s or np.inf)
                worker.advance(node, now)
            request = prepared.blocks[first:end]
            ttft[r], hit_blocks[r] = _serve(node, prepared, request, latency, served, worker, value)
            seen = np.unique(request)
            if config.warmup:  # before the bump: probes see what the manifest knew
                demand.observe(now, seen, (manifest, recent))
            manifest.bump(seen, now)
            recent.bump(seen, now)
    finally:
        node.close()
    warm = {
        "items": worker.items, "used": worker.used, "cost_s": round(worker.cost_s, 3),
        "tier_errors": sum(node.errors.values()),
        "expected_used": round(worker.expected_used, 1),
    }  # fmt: skip
    return ArmResult(ttft, served, len(trace.accesses), restarts, hit_blocks, np.diff(bounds), warm)


def _serve(
    node: Node,
    prepared: PreparedTrace,
    request: np.ndarray,
    latency: ReplayLatency,
    served: dict[str, int],
    worker: WarmWorker,
    value: bytes,
) -> tuple[float, int]:
    """Walk one request's blocks; returns (TTFT ms, usable cached blocks)."""
    cache, keys = node.cache, prepared.keys
    ttft = latency.base_ms
    usable = 0
    missed = False
    last = len(request) - 1
    for position, block in enumerate(request.tolist()):
        key = keys[block]
        if not missed:
            found, tier = cache.get_with_tier(key)
            if found is not None and tier is not None:
                ttft += latency.load_ms_per_block.get(tier, 0.0)
                served[tier] += 1
                usable += 1
                worker.note_use(block)
                continue
            missed = True
        ttft += latency.prefill_ms(int(prepared.tokens[block]))
        worker.note_recomputed(block)
        parent = keys[request[position - 1]] if position else None
        cache.put(key, value, parent=parent, hint=Hint.TAIL if position == last else None)
    return ttft, usable


def _window_stats(result: ArmResult, mask: np.ndarray) -> dict[str, Any]:
    if not mask.any():
        return {"requests": 0, "hit_ratio": 0.0, "ttft_ms": {"p50": 0.0, "p95": 0.0, "mean": 0.0}}
    ttft = result.ttft_ms[mask]
    return {
        "requests": int(mask.sum()),
        "hit_ratio": round(
            float(result.hit_blocks[mask].sum() / result.request_blocks[mask].sum()), 4
        ),
        "ttft_ms": {
            "p50": round(float(np.percentile(ttft, 50)), 2),
            "p95": round(float(np.percentile(ttft, 95)), 2),
            "mean": round(float(ttft.mean()), 2),
        },
    }


def after_restart_mask(times: np.ndarray, restarts: list[float], window_s: float) -> np.ndarray:
    """(R,) requests that arrive within `window_s` after a restart."""
    mask = np.zeros(len(times), dtype=bool)
    for at in restarts:
        mask |= (times >= at) & (times < at + window_s)
    return mask


def summarize(
    result: ArmResult, reference: ArmResult, request_times: np.ndarray, config: ReplayConfig,
    latency: ReplayLatency,
) -> dict[str, Any]:  # fmt: skip
    """The JSON object of `preheat replay` (fields named in issue 7)."""
    total_served = sum(result.served.values())
    after = after_restart_mask(request_times, result.restarts, config.window_s)
    items = int(result.warm.get("items", 0))
    ttft = result.ttft_ms
    return {
        "requests": len(ttft),
        "hit_ratio": {
            **{tier: round(result.served[tier] / result.blocks, 4) for tier in TIERS},
            "total": round(total_served / result.blocks, 4),
        },
        "ttft_ms": {
            "p50": round(float(np.percentile(ttft, 50)), 2),
            "p95": round(float(np.percentile(ttft, 95)), 2),
            "p99": round(float(np.percentile(ttft, 99)), 2),
            "mean": round(float(ttft.mean()), 2),
        },
        "after_restart": _window_stats(result, after),
        "warmup": {
            "items": items,
            "precision": round(result.warm.get("used", 0) / items, 4) if items else 0.0,
            "cost_s": result.warm.get("cost_s", 0.0),
            "target_precision": config.target_precision,
            # the plans' own forecast of the precision: their items' mean P(used) when planned
            "expected_precision": (
                round(result.warm.get("expected_used", 0.0) / items, 4) if items else 0.0
            ),
        },
        "restore_reference": {"after_restart": _window_stats(reference, after)},
        "restarts": len(result.restarts),
        # Failed tier operations (each degraded to a miss): non-zero means the machine, not the
        # policy, shaped some of the numbers.
        "tier_errors": int(result.warm.get("tier_errors", 0)),
        "config": asdict(config),
        "latency_model": latency.to_dict(),
    }


def replay_arms(
    prepared: PreparedTrace,
    configs: dict[str, ReplayConfig],
    latency: ReplayLatency,
    redis_url: str | None = None,
) -> dict[str, ArmResult]:
    """Replay each named configuration on its own (an emptied Redis each: arms share nothing)."""
    results = {}
    for name, config in configs.items():
        if config.redis > 0:
            if redis_url is None:
                raise ValueError("--redis needs a Redis (settings.redis_url, or the embedded one)")
            blocks = round(config.redis * len(prepared.keys))
            limit_redis(redis_url, blocks, config.value_bytes, prepared.keys[0])
        results[name] = replay_arm(prepared, config, latency, redis_url)
    return results


def reference_config(config: ReplayConfig) -> ReplayConfig:
    """The restore reference: no restarts (an instant restore), no warm-up."""
    return ReplayConfig(**{**asdict(config), "restart_every_s": None, "warmup": False})


def request_times(trace: AccessTrace) -> np.ndarray:
    times = trace.times if trace.times is not None else np.arange(len(trace.accesses), dtype=float)
    return times[trace.request_starts]


def run_replay(
    trace: AccessTrace, config: ReplayConfig, latency: ReplayLatency, redis_url: str | None = None
) -> dict[str, Any]:
    """Replay `config`'s arm and the restore reference, and summarise (the CLI's JSON)."""
    prepared = PreparedTrace.build(trace)
    arms = replay_arms(
        prepared, {"arm": config, "reference": reference_config(config)}, latency, redis_url
    )
    return summarize(arms["arm"], arms["reference"], request_times(trace), config, latency)


def limit_redis(redis_url: str, blocks: int, value_bytes: int, sample_key: str) -> None:
    """Empty the replay's Redis and cap it at `blocks` entries' worth of memory, evicting LRU.

    Destructive by design (FLUSHDB, maxmemory): give it only a server the replay owns — the CLI
    always starts a private one, never the Redis in the settings.

    Redis sizes itself in bytes, so the cap is the measured memory of one stored block (a real
    key of the trace, under the tier's namespace) times `blocks` on top of the empty server's own
    use: the shared tier holds about as many blocks as asked, evicted the way a production Redis
    with `allkeys-lru` would.
    """
    import redis

    from cache_runtime.tiers.redis_tier import RedisTier

    client = redis.Redis.from_url(redis_url)
    try:
        client.config_set("maxmemory", 0)
        client.flushdb()
        probe = RedisTier(client, namespace="replay", bulk_connections=1).redis_key(sample_key)
        client.set(probe, bytes(value_bytes))
        per_key = int(client.memory_usage(probe) or value_bytes)
        client.delete(probe)
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory-policy", "allkeys-lru")
        # 1% and 16 KiB of slack: client buffers and bookkeeping also count against maxmemory
        client.config_set("maxmemory", used + int(max(blocks, 1) * per_key * 1.01) + 16_384)
    finally:
        client.close()
