"""Settings: defaults, environment over TOML file, validation errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from cache_runtime.settings import load_settings


def test_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    settings = load_settings()
    assert settings.data_dir == Path("data")
    assert settings.redis_url is None
    assert settings.mlflow_uri == "sqlite:///mlruns/mlflow.db"


def test_toml_file_then_env_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "preheat.toml"
    config.write_text('data_dir = "/srv/preheat"\nredis_url = "redis://cache:6379/2"\n')
    settings = load_settings(config)
    assert settings.data_dir == Path("/srv/preheat")
    assert settings.redis_url == "redis://cache:6379/2"
    monkeypatch.setenv("PREHEAT_DATA_DIR", "/env/wins")
    assert load_settings(config).data_dir == Path("/env/wins")
    assert load_settings(config, data_dir=Path("/arg/wins")).data_dir == Path("/arg/wins")


def test_implicit_toml_in_working_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "preheat.toml").write_text("request_stream_maxlen = 500\n")
    assert load_settings().request_stream_maxlen == 500


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('redis_url = "http://localhost"\n', "must start with redis://"),
        ("request_stream_maxlen = 0\n", "greater than 0"),
        ("data_dri = 'x'\n", "Extra inputs are not permitted"),
    ],
)
def test_invalid_settings_name_the_field(tmp_path: Path, toml: str, message: str) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(toml)
    with pytest.raises(ValidationError, match=message):
        load_settings(config)


def test_missing_explicit_config_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="config file not found"):
        load_settings(tmp_path / "nope.toml")


def test_serve_settings_from_toml_table_and_nested_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "preheat.toml"
    config.write_text("[serve]\nprefect_port = 4300\nwarmup_interval_s = 120\n")
    settings = load_settings(config)
    assert settings.serve.prefect_port == 4300
    assert settings.serve.warmup_interval_s == 120
    assert settings.serve.mlflow_port == 5000  # untouched fields keep their defaults
    monkeypatch.setenv("PREHEAT_SERVE__PREFECT_PORT", "4400")
    assert load_settings(config).serve.prefect_port == 4400


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[serve]\nprefect_port = 70000\n", "less than 65536"),
        ("[serve]\nwork_pool = 'a pool'\n", "should match pattern"),
        ("[serve]\nprefect_prot = 1\n", "Extra inputs are not permitted"),
    ],
)
def test_invalid_serve_settings_name_the_field(tmp_path: Path, toml: str, message: str) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(toml)
    with pytest.raises(ValidationError, match=message):
        load_settings(config)


def test_redis_cluster_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_settings().redis_cluster is False
    monkeypatch.setenv("PREHEAT_REDIS_URL", "redis://node-a:7000/0")
    monkeypatch.setenv("PREHEAT_REDIS_CLUSTER", "1")
    assert load_settings().redis_cluster is True


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("redis_cluster = true\n", "redis_cluster needs redis_url: a node to discover"),
        (
            'redis_cluster = true\nredis_url = "unix:///tmp/redis.sock"\n',
            r"redis_cluster: a Redis Cluster needs a redis:// or rediss:// URL \(it has no unix",
        ),
        (
            'redis_cluster = true\nredis_url = "redis://node-a:7000/2"\n',
            "redis_cluster: a Redis Cluster has only database 0: drop the database from the URL",
        ),
        (
            'redis_cluster = true\nredis_url = "redis://node-a:7000"\n'
            '[serve]\nprefect_messaging = "redis"\n',
            'serve.prefect_messaging = "redis" needs a standalone Redis, not redis_cluster',
        ),
    ],
)
def test_redis_cluster_combos_that_cannot_work(tmp_path: Path, toml: str, message: str) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(toml)
    with pytest.raises(ValidationError, match=message) as raised:
        load_settings(config)
    (error,) = raised.value.errors()
    assert "\n" not in error["msg"]


def test_a_node_spec_without_redis_ignores_the_cluster_flag_of_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Warm-up tasks and gateways rebuild settings from their own spec: the environment's
    cluster flag applies to a spec's Redis URL, and a spec without one has no Redis tier."""
    from cache_runtime.node_cache import node_settings

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PREHEAT_REDIS_CLUSTER", "1")
    without = node_settings(tmp_path, None)
    assert (without.redis_url, without.redis_cluster) == (None, False)
    with_url = node_settings(str(tmp_path), "redis://node-a:7000")
    assert (with_url.redis_url, with_url.redis_cluster) == ("redis://node-a:7000", True)
    assert with_url.data_dir == tmp_path
