"""LLM backends for warm-up: what actually fills a cache with a prefix's KV or a response.

`backends` holds the `WarmupBackend` protocol and its two implementations: `HFBackend` (an
in-process Hugging Face causal LM whose KV pages go into the project's `HybridCache`) and
`OpenAICompatibleBackend` (a remote vLLM / SGLang server, warmed by sending it the prefix so its
own automatic prefix cache fills). `registry` logs, registers and loads the LLM through MLflow;
`openai_server` is a small OpenAI-compatible server over an `HFBackend`, for the demo and tests.

Nothing is re-exported here: importing the package must not pull in torch, MLflow or FastAPI.
"""
