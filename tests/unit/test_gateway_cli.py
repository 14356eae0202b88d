"""`preheat gateway`'s one-line refusals, before any model or port is touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.cli.common import EXIT_BAD_INPUT, CliError
from flows.cli.gateway import gateway_command


@pytest.mark.parametrize(
    ("content", "options", "message"),
    [
        (None, {}, "no such file or directory"),
        ("{not json", {}, "is not valid JSON/TOML"),
        ('{"keys": {"sk-1": "acme"}}', {"backend": "openai"}, "needs base_url and upstream_model"),
        ('{"keys": {"sk-1": "acme"}}', {"backend": "vllm"}, "invalid gateway settings: backend"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(
    tmp_path: Path, content: str | None, options: dict[str, str], message: str
) -> None:
    keys = tmp_path / "keys.json"
    if content is not None:
        keys.write_text(content)
    with pytest.raises(CliError, match=message) as refused:
        gateway_command(keys=keys, redis=False, data_dir=tmp_path / "data", **options)
    assert refused.value.code == EXIT_BAD_INPUT and "\n" not in str(refused.value)


def test_tracing_to_otlp_without_an_endpoint_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PREHEAT_TRACING_ENDPOINT", raising=False)
    keys = tmp_path / "keys.json"
    keys.write_text('{"keys": {"sk-1": "acme"}}')
    with pytest.raises(CliError, match=r"invalid tracing settings: .*needs an endpoint") as refused:
        gateway_command(keys=keys, redis=False, data_dir=tmp_path / "data", tracing="otlp")
    assert refused.value.code == EXIT_BAD_INPUT and "\n" not in str(refused.value)
