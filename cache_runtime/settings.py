"""Platform settings: environment (`PREHEAT_` prefix) over an optional TOML file over defaults.

Nothing is read at import time: call `load_settings()` where the settings are needed, so tests
and the CLI can point the platform elsewhere without reloading modules.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

CONFIG_ENV = "PREHEAT_CONFIG"
DEFAULT_CONFIG_FILE = "preheat.toml"


class Settings(BaseSettings):
    """Where the platform keeps its data and which services it talks to.

    Attributes:
        data_dir: root of the lake, quarantine, features and the SSD tier.
        redis_url: an existing Redis to use. When unset, the platform starts its own
            `redis-server` on a free loopback port (see `cache_runtime.services`).
        mlflow_uri: tracking URI. MLflow 3.17 refuses a plain `./mlruns` file store, so the
            default is a sqlite file with artifacts beside it under `mlruns/`.
        request_stream: the Redis Stream that live request logs are appended to.
        request_stream_maxlen: approximate cap on that stream (XADD MAXLEN ~), so a stalled
            consumer cannot exhaust Redis memory; entries beyond it are trimmed oldest first.
    """

    model_config = SettingsConfigDict(env_prefix="PREHEAT_", extra="forbid")

    data_dir: Path = Path("data")
    redis_url: str | None = None
    mlflow_uri: str = "sqlite:///mlruns/mlflow.db"
    mlflow_artifacts: Path = Path("mlruns/artifacts")
    request_stream: str = Field(default="preheat:requests", min_length=1)
    request_stream_maxlen: int = Field(default=1_000_000, gt=0)

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return value

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
