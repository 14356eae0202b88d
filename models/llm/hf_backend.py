"""`HFBackend`: a Hugging Face causal LM in this process, its prompts' KV kept in 16-token pages.

Warming a prompt prefills it once and stores the KV of its full pages in a `HybridCache`
(`cache_runtime.kv_pages`), so a later request only prefills what follows the cached pages.
Pages are keyed by `model_fingerprint` (the weights and config), not by a path or a registry
version: see `models.llm.backends`.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cache_runtime.keys import ExactKey
from cache_runtime.kv_pages import PAGE_TOKENS, load_prefix, page_keys, store_prefix
from models.llm.backend_contract import (
    DEFAULT_RESPONSE_TOKENS,
    Completion,
    DecodeListener,
    WarmResult,
    answer_generations,
)
from models.llm.batch_decoder import BatchDecoder, Request, default_rows

if TYPE_CHECKING:
    from cache_runtime.hybrid import HybridCache


@dataclass
class _Prefill:
    cached_tokens: int  # tokens whose KV came from the cache
    pages_stored: int
    kv: Any  # DynamicCache over all tokens; None when nothing had to be computed
    logits: Any  # (1, vocab) next-token logits; None when nothing had to be computed


def model_fingerprint(directory: Path) -> str:
    """`<model_type>-<16 hex>`: BLAKE2b of the config (less the fields that only record where
    and with which library it was saved) and of every weight file's bytes.

    Reading the weights costs about what loading them does (and they are in the page cache
    right after). Rejected: a path or name (two fine-tunes saved to the same place would share
    pages) and a registry version (the same weights registered twice would not).
    """
    config = json.loads((directory / "config.json").read_text())
    for field in ("transformers_version", "_name_or_path"):
        config.pop(field, None)
    digest = hashlib.blake2b(json.dumps(config, sort_keys=True).encode(), digest_size=8)
    for weights in sorted([*directory.glob("*.safetensors"), *directory.glob("*.bin")]):
        with weights.open("rb") as stream:
            while chunk := stream.read(1 << 22):
                digest.update(chunk)
    return f"{config.get('model_type', 'model')}-{digest.hexdigest()}"


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _to_device(kv: Any, device: str) -> Any:
    """`load_prefix` assembles pages on the CPU; the model may live on a GPU."""
    if device != "cpu":
        for layer in kv.layers:
            layer.keys, layer.values = layer.keys.to(device), layer.values.to(device)
            layer.device = layer.keys.device
    return kv


class HFBackend:
    """A Hugging Face causal LM in this process, warming KV pages into a `HybridCache`.

    The executor's and the gateway's threads share one backend: every forward pass runs on its
    `BatchDecoder`'s thread, requests with the fewest tokens decoded first, then the least-used
    tenant's, decoding batched across requests where the device gains by it (`batch_decoder.py`).
    """

    name = "hf"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        model_id: str,
        device: str | None = None,
        response_tokens: int = DEFAULT_RESPONSE_TOKENS,
        source: str = "",
    ) -> None:
        self.device = device or _default_device()
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.response_tokens = response_tokens
        self.source = source  # where the weights came from, for logs
        self.context_tokens = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        eos = model.generation_config.eos_token_id
        self._eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        # every forward pass runs on its thread, tenants served least-used first
        self.decoder = BatchDecoder(self.model, self._eos, rows=default_rows(self.device))
        self._cleanup: Any = None  # a TemporaryDirectory the weights were fetched into

    @classmethod
    def from_path(
        cls, path: str | Path, device: str | None = None, model_id: str | None = None
    ) -> HFBackend:
        """Load a directory written by `save_pretrained` (model and tokenizer); never the hub."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        directory = Path(path)
        if not (directory / "config.json").is_file():
            raise FileNotFoundError(f"{directory}: no config.json (not a saved model directory)")
        model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        model_id = model_id or model_fingerprint(directory)
        return cls(model, tokenizer, model_id, device, source=str(directory))

    @classmethod
    def from_registry(
        cls,
        tracking_uri: str,
        name: str = "preheat-llm",
        alias: str = "champion",
        device: str | None = None,
    ) -> HFBackend:
        """Load `models:/<name>@<alias>` from MLflow (see `models.llm.registry`)."""
        import tempfile

        from models.llm.registry import fetch_llm

        scratch = tempfile.TemporaryDirectory(prefix="preheat-llm-")
        try:
            directory, version = fetch_llm(tracking_uri, Path(scratch.name), name, alias)
            backend = cls.from_path(directory, device)
        except BaseException:
            scratch.cleanup()
            raise
        backend.source = f"models:/{name}@{alias} (version {version})"
        backend._cleanup = scratch  # the weights may be memory-mapped from it until close()
        return backend

    def encode(self, prompt: str) -> list[int]:
        # No special tokens: a prefix must tokenise as the start of every prompt that extends it.
        return list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def warm_prefix(
        self,
        tenant: str,
        prompt: str,
        cache: HybridCache | None,
        store_response: bool = False,
        template: str | None = None,
    ) -> WarmResult:
        """Prefill `prompt` and store its new full KV pages; with `store_response`, also
        generate a short greedy response and store it (UTF-8 text) under the prompt's
        `ExactKey`, with the generations read before it was computed. A prompt longer than
        the context is cut to the context (its head: the prefix is what is shared)."""
        started = time.perf_counter()
        key = ExactKey.of(tenant, self.model_id, prompt)
        stamp = answer_generations(cache, key, template) if store_response else None
        room = self.response_tokens if store_response else 0
        tokens = self.encode(prompt)[: self.context_tokens - room]
        if not tokens:
            raise ValueError("cannot warm an empty prompt")
        response = None
        with self.decoder.request(tenant) as request:  # (its turns on the model)
            prefill = self._prefill(request, tokens, cache, need_logits=store_response)
            if store_response:
                ids, _ = self._generate(request, prefill, self.response_tokens, 0.0, None)
                response = self.tokenizer.decode(ids, skip_special_tokens=True)
        if response is not None and cache is not None and stamp is not None:
            cache.put(key, response.encode(), template=template, generations=stamp)
        return WarmResult(
            self.name, len(tokens), prefill.pages_stored, prefill.cached_tokens,
            time.perf_counter() - started, response, self.device,
        )  # fmt: skip

    def complete(
        self,
        prompt: str,
        max_tokens: int,
        temperature: float = 0.0,
        cache: HybridCache | None = None,
        tenant: str = "default",
        seed: int | None = None,
        session: str | None = None,
        listener: DecodeListener | None = None,
    ) -> Completion:
        """Serve one completion, reusing and filling `cache`'s KV pages for its prompt.
        `session`: the application's conversation id, if any: its pages count as read by it
        (`HybridCache.end_session` cools those no other conversation read). `listener`: told
        when decoding starts and given the text as each token is decoded (streaming); it
        ends the generation early by returning False (finish reason "stop").

        Raises:
            ValueError: empty prompt, or prompt plus `max_tokens` beyond the context.
        """
        tokens = self.encode(prompt)
        if not tokens or len(tokens) + max_tokens > self.context_tokens:
            raise ValueError(
                f"prompt of {len(tokens)} tokens plus max_tokens {max_tokens} does not fit the "
                f"context of {self.context_tokens} tokens (and a prompt must not be empty)"
            )
        with self.decoder.request(tenant) as request:  # (its turns on the model)
            prefill = self._prefill(request, tokens, cache, need_logits=True, session=session)
            on_ids = None
            if listener is not None:
                listener.started(prefill.cached_tokens)
                on_ids = self._text_deltas(listener)
            ids, finish = self._generate(request, prefill, max_tokens, temperature, seed, on_ids)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Completion(
            text, len(tokens), len(ids), prefill.cached_tokens, prefill.pages_stored, finish
        )

    def _prefill(
        self,
        request: Request,
        tokens: list[int],
        cache: HybridCache | None,
        need_logits: bool,
        session: str | None = None,
    ) -> _Prefill:
        """Prefill what the cache does not hold; store the new full pages. `session`: the
        conversation the request belongs to (see `HybridCache.end_session`).

        The KV restored covers at most `tokens[:-1]`: next-token logits need at least one
        token computed (as in vLLM, a fully cached prompt still recomputes its last page).
        The forward pass is one of `request`'s turns on the model's decoder thread; the cache's
        reads and writes happen on the caller's thread, around it.
        """
        import torch

        tenant = request.tenant
        if cache is not None:
            # idle ends due before this request come first, as `bench cache` places them
            cache.end_idle_sessions()
        keys = page_keys(tenant, self.model_id, tokens)
        present = cache.longest_prefix(keys) if cache is not None else 0
        if present == len(keys) and not need_logits:
            return _Prefill(present * PAGE_TOKENS, 0, None, None)  # nothing new
        kv, reused = None, 0
        if present and cache is not None:
            kv, reused = load_prefix(cache, tenant, self.model_id, tokens[:-1], self.model.config)
        if kv is not None:
            kv = _to_device(kv, self.device)
        ids = torch.tensor([tokens[reused:]], device=self.device)
        out = self.decoder.forward(
            request, lambda: self.model(ids, cache=kv, use_cache=True, logits_to_keep=1)
        )
        stored = 0
        if cache is not None:
            # `present` may exceed what was loaded (the last page, see above): not rewritten.
            first = max(present, reused // PAGE_TOKENS)
            # a session already seen: a follow-up turn, whose pages its next turn reads again
            follow_up = session is not None and cache.sessions.live(tenant, session)
            stored = store_prefix(
                cache, tenant, self.model_id, tokens, out.cache, turn=1 if follow_up else 0,
                first=first,
            )  # fmt: skip
            # what the request read: every page of its prompt the cache now holds (loaded or
            # stored), for its session; with none, those pages are shared by nobody's session
            read = [key.to_string() for key in keys[: first + stored]]
            if session is not None:
                cache.sessions.read(tenant, session, read)
            else:
                cache.sessions.read_anonymously(tenant, read)
        return _Prefill(reused, stored, out.cache, out.logits[:, -1])

    def _text_deltas(self, listener: DecodeListener) -> Callable[[list[int]], bool]:
        """`on_ids` for `_generate`: the text the new token adds, to `listener.text`. The ids so
        far are decoded whole (a token may complete a character the previous one began:
        decoding tokens one by one would split it); a trailing replacement character waits
        for the token that completes it."""
        sent = 0

        def on_ids(ids: list[int]) -> bool:
            nonlocal sent
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            if text.endswith("\ufffd"):
                return True
            delta, sent = text[sent:], len(text)
            return listener.text(delta) if delta else True

        return on_ids

    def _generate(
        self,
        request: Request,
        prefill: _Prefill,
        max_tokens: int,
        temperature: float,
        seed: int | None,
        on_ids: Callable[[list[int]], bool] | None = None,
    ) -> tuple[list[int], str]:
        """Greedy (temperature 0) or sampled decoding from a prefill, in the decoder's batch
        with every other request's (`BatchDecoder.decode`); `on_ids(ids so far)` after each
        token (False ends it: finish reason "stop").

        Rather than `model.generate`: the prefill's cache and logits are reused as they are,
        other requests' sequences share each forward pass, and there is no generation config
        to reconcile.
        """
        ids: list[int] = []
        tokens = self.decoder.decode(
            request, prefill.kv, prefill.logits, max_tokens, temperature, seed
        )
        try:
            for token in tokens:
                ids.append(token)
                if token in self._eos or (on_ids is not None and not on_ids(ids)):
                    return ids, "stop"
        finally:
            tokens.close()  # (early: its row leaves the batch)
        return ids, "length"

    def close(self) -> None:
        self.decoder.close()
        if self._cleanup is not None:
            self._cleanup.cleanup()
            self._cleanup = None
