"""`preheat replay`: a trace replayed in trace time against the hybrid cache, warm-up on or off.

Each request walks its prompt blocks through the node's `HybridCache`: a block is a usable hit
while every block before it hit (KV prefix semantics), and costs the load from the tier that
held it; from the first miss on, every block is prefilled and written back. Restarts (every
`restart_every_s`) wipe the node's memory and SSD tiers. With warm-up on, after each restart the
worker rehydrates the node from the heat manifest (the past of the trace only), and every
`ahead_every_s` during normal running it warms blocks whose heat predicts demand but that the
node no longer holds; its work takes modelled time, so items arrive progressively. Plans are
sized to what the worker delivers before the demand (`models.evaluation.replay.planning`), from a
model of when blocks are asked for again learned on the stream (`models.evaluation.replay.demand`).

The restore reference is the same replay where each restart instantly restores the pre-restart
contents — which leaves the cache exactly as if the node had not restarted — so it is run as the
replay without restarts and scored on the same after-restart windows.

The walk records each request's KV loads and prompt tokens left to prefill; TTFT comes after
the walk, from the prefill queue (`queueing`): the cache decides what a request costs, the
engine when it is served, and every arm of one comparison is priced by the same engine.
`--load X` divides the trace's arrival times by X (`scale_load`): restarts, windows and heat
stay in clock seconds. The tiers are the fast replay's (`sim_tiers`) unless `real_tiers`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from itertools import pairwise
from typing import Any

import numpy as np
from pydantic import ValidationError

from cache_runtime.keys import PrefixKey
from cache_runtime.policies import Hint
from cache_runtime.settings import PolicySettings
from cache_runtime.traces import MOONCAKE_BLOCK_TOKENS, AccessTrace
from models.evaluation.replay.demand import DemandModel
from models.evaluation.replay.latency import ReplayLatency
from models.evaluation.replay.node import Node, TraceClock
from models.evaluation.replay.planning import plan_ahead, plan_warmup
from models.evaluation.replay.queueing import QueueResult, simulate_queue
from models.evaluation.replay.summary import TIERS, after_restart_mask, summarize
from models.evaluation.replay.warming import HeatManifest, WarmWorker

__all__ = ["after_restart_mask", "summarize"]  # re-exported: the replay's public surface

# what plans the rehydration after a restart: `plan_warmup`, or `hindsight.HindsightPlanner`
Planner = Callable[
    [WarmWorker, Node, DemandModel, tuple[HeatManifest, ...], float, "ReplayConfig", int, int],
    None,
]


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
    # of those are warmed is the plan's cut (`models.evaluation.replay.planning`).
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
    real_tiers: bool = False  # the real SSD and Redis tiers instead of `sim_tiers`'
    load: float = 1.0  # the trace's arrival rate x this (`scale_load`), recorded with the run
    # the memory tier's pool, as `PolicySettings`' fields (empty: the default pool): what
    # `[policy]` / `PREHEAT_POLICY__*` set for a serving node's (`node_cache`), so a replay
    # under a configuration runs the node it describes. Plain values: recorded with the run
    policy: dict[str, Any] = field(default_factory=dict)

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
        if not self.load > 0:
            raise ValueError("--load must be a positive factor")
        self.policy_settings()  # unknown fields or candidates fail here, not at a restart

    def policy_settings(self) -> PolicySettings:
        """`policy` as the settings `PoolPolicy.from_settings` takes; a `ValueError` in one
        line where they are not (as the CLI's errors are)."""
        try:
            return PolicySettings(**self.policy)
        except ValidationError as err:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors()
            )
            raise ValueError(f"policy: {problems}") from None

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
        tokens = np.full(len(unique), MOONCAKE_BLOCK_TOKENS, dtype=np.int64)
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
    ttft_ms: np.ndarray  # (R,) modelled time to first token of each request, queue included
    served: dict[str, int]  # blocks served from each tier (usable prefix hits)
    blocks: int
    restarts: list[float]
    hit_blocks: np.ndarray  # (R,) usable cached blocks of each request
    request_blocks: np.ndarray  # (R,) blocks of each request
    warm: dict[str, float] = field(default_factory=dict)
    queue: QueueResult | None = None  # the prefill servers' schedule (utilisation)
    # (N,) the tier that served each access (index into TIERS), -1 where it was computed
    access_tiers: np.ndarray | None = None


def scale_load(trace: AccessTrace, load: float) -> AccessTrace:
    """The trace with its arrival rate multiplied by `load` (times from the first divided by
    it): the same requests, denser; the replay's clock (restarts, windows, heat) is unchanged."""
    if load == 1.0 or trace.times is None:
        return trace
    start = float(trace.times[0])
    return replace(trace, times=start + (trace.times - start) / load)


def _sizes(config: ReplayConfig, unique: int) -> tuple[int, int]:
    return round(config.memory * unique), round(config.ssd * unique)


def _node(config: ReplayConfig, prepared: PreparedTrace, redis_url: str | None) -> Node:
    memory_blocks, ssd_blocks = _sizes(config, len(prepared.keys))
    shared = None if config.real_tiers else round(config.redis * len(prepared.keys))
    real_redis = redis_url if config.redis > 0 and config.real_tiers else None
    return Node(
        memory_blocks, ssd_blocks, TraceClock(), real_redis, config.value_bytes,
        fast_redis_blocks=shared, policy=config.policy_settings(),
    )  # fmt: skip


def replay_arm(
    prepared: PreparedTrace,
    config: ReplayConfig,
    latency: ReplayLatency,
    redis_url: str | None = None,
    planner: Planner = plan_warmup,
) -> ArmResult:
    """One replay of the whole trace; see the module docstring for what it models. `planner`
    plans each rehydration (`hindsight.HindsightPlanner` for the plan that knows the future)."""
    trace = prepared.trace
    memory_blocks, ssd_blocks = _sizes(config, len(prepared.keys))
    node, value = _node(config, prepared, redis_url), bytes(config.value_bytes)
    manifest = HeatManifest(len(prepared.keys), config.half_life_s)
    recent = HeatManifest(len(prepared.keys), config.order_half_life_s)
    worker = WarmWorker(prepared.keys, prepared.parents, prepared.tokens, latency, value)
    demand = DemandModel(
        config.window_s, config.retention, config.min_expected_uses, groups=prepared.cohorts
    )
    bounds = np.append(trace.request_starts, len(trace.accesses))
    times = request_times(trace)
    next_restart = times[0] + config.restart_every_s if config.restart_every_s else np.inf
    next_ahead = times[0] + config.ahead_every_s if config.ahead_every_s else np.inf
    costs = np.zeros((len(times), 2))  # (R, load ms | prefill tokens) of each request
    hit_blocks = np.zeros(len(times), dtype=np.int64)
    access_tiers = np.full(len(trace.accesses), -1, dtype=np.int8)
    served, restarts = dict.fromkeys(TIERS, 0), []
    try:
        for r, (first, end) in enumerate(pairwise(bounds.tolist())):
            now = node.clock.now = float(times[r])
            while now >= next_restart:
                node.restart()
                worker.forget_local()
                restarts.append(float(next_restart))
                if config.warmup:
                    planner(
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
            load_ms, tokens, hit_blocks[r] = _serve(
                node, prepared, request, latency, served, worker, value, access_tiers[first:end]
            )
            costs[r] = load_ms, tokens
            seen = np.unique(request)
            if config.warmup:  # before the bump: probes see what the manifest knew
                demand.observe(now, seen, (manifest, recent))
            manifest.bump(seen, now)
            recent.bump(seen, now)
    finally:
        node.close()
    ttft, queue = _priced(times, costs, latency)
    return ArmResult(
        ttft, served, len(trace.accesses), restarts, hit_blocks, np.diff(bounds),
        _warm_counts(worker, node), queue, access_tiers,
    )  # fmt: skip


def _warm_counts(worker: WarmWorker, node: Node) -> dict[str, float]:
    return {
        "items": worker.items, "used": worker.used, "cost_s": round(worker.cost_s, 3),
        "tier_errors": sum(node.errors.values()),
        "expected_used": round(worker.expected_used, 1),
    }  # fmt: skip


def _priced(
    times: np.ndarray, costs: np.ndarray, latency: ReplayLatency
) -> tuple[np.ndarray, QueueResult]:
    """(R,) TTFT ms of requests arriving at `times` (s) with `costs` (R, load ms | prefill
    tokens), and the prefill servers' schedule: first token - arrival + the fixed overhead."""
    queue = simulate_queue(
        times * 1000, costs[:, 0], costs[:, 1], latency.servers, latency.prefill_ms_per_token,
        latency.chunk_tokens,
    )  # fmt: skip
    return queue.done_ms - times * 1000 + latency.base_ms, queue


def _serve(
    node: Node,
    prepared: PreparedTrace,
    request: np.ndarray,
    latency: ReplayLatency,
    served: dict[str, int],
    worker: WarmWorker,
    value: bytes,
    tiers_out: np.ndarray,
) -> tuple[float, int, int]:
    """Walk one request's blocks, noting in `tiers_out` (its accesses) the tier that served
    each; returns (ms of KV loads, prompt tokens to prefill, usable cached blocks)."""
    cache, keys = node.cache, prepared.keys
    load_ms = 0.0
    tokens = usable = 0
    missed = False
    last = len(request) - 1
    for position, block in enumerate(request.tolist()):
        key = keys[block]
        if not missed:
            found, tier = cache.get_with_tier(key)
            if found is not None and tier is not None:
                load_ms += latency.load_ms_per_block.get(tier, 0.0)
                served[tier] += 1
                tiers_out[position] = TIERS.index(tier)
                usable += 1
                worker.note_use(block)
                continue
            missed = True
        tokens += int(prepared.tokens[block])
        worker.note_recomputed(block)
        parent = keys[request[position - 1]] if position else None
        cache.put(key, value, parent=parent, hint=Hint.TAIL if position == last else None)
    return load_ms, tokens, usable


def replay_arms(
    prepared: PreparedTrace,
    configs: dict[str, ReplayConfig],
    latency: ReplayLatency,
    redis_url: str | None = None,
) -> dict[str, ArmResult]:
    """Replay each named configuration on its own (an emptied Redis each: arms share nothing),
    all priced by the one `latency`."""
    results = {}
    for name, config in configs.items():
        if config.redis > 0 and config.real_tiers:
            if redis_url is None:
                raise ValueError("--redis needs a Redis (settings.redis_url, or the embedded one)")
            blocks = round(config.redis * len(prepared.keys))
            limit_redis(redis_url, blocks, config.value_bytes, prepared.keys[0])
        results[name] = replay_arm(prepared, config, latency, redis_url)
    return results


def reference_config(config: ReplayConfig) -> ReplayConfig:
    """The restore reference: no restarts (an instant restore), no warm-up."""
    return ReplayConfig(**{**asdict(config), "restart_every_s": None, "warmup": False})


def comparison_configs(config: ReplayConfig, both: bool = False) -> dict[str, ReplayConfig]:
    """The arms one comparison replays: warm-up off, the restore reference, and warm-up on
    when `config` asks for it (or `both`)."""
    arms = {
        "off": replace(config, warmup=False),
        "reference": reference_config(config),
    }
    if config.warmup or both:
        arms["on"] = replace(config, warmup=True)
    return arms


def request_times(trace: AccessTrace) -> np.ndarray:
    """(R,) arrival of each request, seconds (the access index where the trace has no times)."""
    times = trace.times if trace.times is not None else np.arange(len(trace.accesses), dtype=float)
    return times[trace.request_starts].astype(float)


def replay_comparison(
    trace: AccessTrace, config: ReplayConfig, latency: ReplayLatency,
    redis_url: str | None = None, both: bool = False,
) -> tuple[dict[str, ArmResult], np.ndarray]:  # fmt: skip
    """The arms of `comparison_configs(config, both)` replayed on `trace` at `config.load`, all
    priced by the one `latency`; with each request's arrival (R,) on the scaled clock."""
    scaled = scale_load(trace, config.load)
    configs = comparison_configs(config, both)
    arms = replay_arms(PreparedTrace.build(scaled), configs, latency, redis_url)
    return arms, request_times(scaled)


def run_replay(
    trace: AccessTrace, config: ReplayConfig, latency: ReplayLatency, redis_url: str | None = None
) -> dict[str, Any]:
    """Replay the comparison of `config` at its load and summarise `config`'s arm (the CLI's
    JSON, without the report)."""
    arms, times = replay_comparison(trace, config, latency, redis_url)
    return summarize(arms, "on" if config.warmup else "off", times, config, latency)


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
