"""Platform settings: environment (`PREHEAT_` prefix) over an optional TOML file over defaults.

Nothing is read at import time: call `load_settings()` where the settings are needed, so tests
and the CLI can point the platform elsewhere without reloading modules.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

CONFIG_ENV = "PREHEAT_CONFIG"
DEFAULT_CONFIG_FILE = "preheat.toml"


class ServeSettings(BaseModel):
    """`preheat serve`: where the coordinator's services listen and when each deployment runs.

    Set in the `[serve]` table of `preheat.toml` or as `PREHEAT_SERVE__<FIELD>` (for example
    `PREHEAT_SERVE__PREFECT_PORT=4300`). Intervals are seconds; crons are in `timezone`.

    Attributes:
        host: the address every service binds (loopback: nothing is exposed by default).
        prefect_port / mlflow_port / redis_port: the UIs' and the project Redis's ports.
        work_pool: the coordinator's process work pool; a serving node runs its own pool
            (`preheat serve --pool NAME --worker-only`) so warm-up for a node runs on it.
        warmup_peak_lead_s: how long before each predicted demand peak a warm-up is scheduled.
        flow_retries / flow_retry_delay_s: a deployment's failed flow run is retried this often
            (Prefect's flow retries wait a fixed delay; the tasks inside back off on their own).
        prefect_database_url: the Prefect server's database (default: sqlite under the data
            directory; `postgresql+asyncpg://...` for several API servers).
        prefect_messaging: `memory` (one server) or `redis`: Prefect's events and message cache
            on the project's Redis (prefect-redis), so several API servers share events.
        warmup_runner: `threads` (one process) or `dask`: the scheduled warm-up fans its batches
            out over Dask (`PREHEAT_DASK_ADDRESS`, else a local cluster of
            `PREHEAT_DASK_WORKERS` processes; see `flows/warmup/dask_flow.py`).
    """

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    prefect_port: int = Field(default=4200, gt=0, lt=65536)
    mlflow_port: int = Field(default=5000, gt=0, lt=65536)
    redis_port: int = Field(default=6390, gt=0, lt=65536)
    work_pool: str = Field(default="preheat", pattern=r"^[A-Za-z0-9_.-]+$")
    startup_timeout_s: float = Field(default=90.0, gt=0)
    timezone: str = "UTC"
    ingest_interval_s: int = Field(default=300, gt=0)
    features_interval_s: int = Field(default=900, gt=0)
    train_forecaster_cron: str = "0 2 * * *"
    train_heat_gan_cron: str = "0 3 * * 0"  # weekly: heat dynamics move slower than demand
    tune_decay_interval_s: int = Field(default=3600, gt=0)
    mine_templates_cron: str = "30 2 * * *"
    warmup_interval_s: int = Field(default=600, gt=0)
    warmup_peak_lead_s: int = Field(default=600, ge=0)
    peak_planning_interval_s: int = Field(default=3600, gt=0)
    deploy_models_interval_s: int = Field(default=900, gt=0)
    drift_interval_s: int = Field(default=3600, gt=0)
    flow_retries: int = Field(default=2, ge=0)
    flow_retry_delay_s: int = Field(default=60, ge=0)
    prefect_database_url: str | None = None
    prefect_messaging: Literal["memory", "redis"] = "memory"
    warmup_runner: Literal["threads", "dask"] = "threads"


class PolicySettings(BaseModel):
    """The memory tier's default policy (`cache_runtime.pool.PoolPolicy`).

    Set in the `[policy]` table or as `PREHEAT_POLICY__<FIELD>` (`PREHEAT_POLICY__POOL` as a JSON
    list). Build it with `PoolPolicy.from_settings(settings.policy)`.

    Attributes:
        pool: the candidates whose shadows run (`cache_runtime.candidates.CANDIDATES`); the first
            leads until the shadows say otherwise.
        sample_rate: the share of the key space replayed through the shadows (SHARDS' R),
            raised for small caches so that each shadow holds `min_shadow` entries.
        window / hysteresis: sampled accesses scored, and the lead (a share of them) that a
            challenger needs to take over (half of it where every key is sampled:
            `cache_runtime.pool.CHEAP_LEAD`), and a hinted twin over its plain one, or back
            (the first candidate starts as its family's choice).
    """

    model_config = ConfigDict(extra="forbid")

    pool: tuple[str, ...] = ()  # empty: every candidate (`cache_runtime.pool.DEFAULT_POOL`)
    sample_rate: float = Field(default=1 / 16, gt=0, le=1)
    window: int = Field(default=4096, gt=0)
    hysteresis: float = Field(default=0.005, ge=0)
    min_shadow: int = Field(default=128, gt=0)

    @field_validator("pool")
    @classmethod
    def _known_candidates(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from cache_runtime.candidates import CANDIDATES

        unknown = [name for name in value if name not in CANDIDATES]
        if unknown:
            raise ValueError(f"unknown candidates {unknown}; choose from {', '.join(CANDIDATES)}")
        return value


class Settings(BaseSettings):
    """Where the platform keeps its data and which services it talks to.

    Attributes:
        data_dir: root of the lake, quarantine, features and the SSD tier.
        redis_url: an existing Redis to use. When unset, the platform starts its own
            `redis-server` on a free loopback port (see `cache_runtime.services`).
        redis_cluster: `redis_url` names a node of a Redis Cluster (`PREHEAT_REDIS_CLUSTER=1`):
            the node cache's Redis tier is then a cluster client (`redis_client(...,
            cluster=True)`) that starts even while the cluster is down. Only that tier: the
            live request stream still talks to `redis_url`'s node as a standalone Redis, and
            Prefect's Redis messaging (`serve.prefect_messaging = "redis"`) is refused with it.
        mlflow_uri: tracking URI. MLflow 3.17 refuses a plain `./mlruns` file store, so the
            default is a sqlite file with artifacts beside it under `mlruns/`.
        request_stream: the Redis Stream that live request logs are appended to.
        request_stream_maxlen: approximate cap on that stream (XADD MAXLEN ~), so a stalled
            consumer cannot exhaust Redis memory; entries beyond it are trimmed oldest first.
        serve: the coordinator's services and schedules (`ServeSettings`).
        policy: the memory tier's pool of policies (`PolicySettings`).
    """

    model_config = SettingsConfigDict(
        env_prefix="PREHEAT_", extra="forbid", env_nested_delimiter="__"
    )

    data_dir: Path = Path("data")
    redis_url: str | None = None
    redis_cluster: bool = False
    mlflow_uri: str = "sqlite:///mlruns/mlflow.db"
    mlflow_artifacts: Path = Path("mlruns/artifacts")
    request_stream: str = Field(default="preheat:requests", min_length=1)
    request_stream_maxlen: int = Field(default=1_000_000, gt=0)
    serve: ServeSettings = Field(default_factory=ServeSettings)
    policy: PolicySettings = Field(default_factory=PolicySettings)

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return value

    @model_validator(mode="after")
    def _redis_cluster_combos(self) -> Settings:
        if not self.redis_cluster:
            return self
        if self.redis_url is None:
            raise ValueError("redis_cluster needs redis_url: a node to discover the cluster from")
        from cache_runtime.tiers.redis_cluster import cluster_url_problem

        if problem := cluster_url_problem(self.redis_url):
            raise ValueError(f"redis_cluster: {problem}")
        if self.serve.prefect_messaging == "redis":
            raise ValueError(
                'serve.prefect_messaging = "redis" needs a standalone Redis, not redis_cluster'
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Precedence: explicit arguments, then environment, then the TOML file.
        toml_file = os.environ.get(CONFIG_ENV, DEFAULT_CONFIG_FILE)
        toml = TomlConfigSettingsSource(settings_cls, toml_file=toml_file)
        return (init_settings, env_settings, toml)


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Load settings; `config_file` (when given) must exist, unlike the implicit `preheat.toml`."""
    if config_file is not None:
        if not config_file.is_file():
            raise FileNotFoundError(f"config file not found: {config_file}")
        previous = os.environ.get(CONFIG_ENV)
        os.environ[CONFIG_ENV] = str(config_file)
        try:
            return Settings(**overrides)
        finally:
            if previous is None:
                os.environ.pop(CONFIG_ENV, None)
            else:
                os.environ[CONFIG_ENV] = previous
    return Settings(**overrides)
