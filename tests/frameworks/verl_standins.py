"""verl's rollout server, stood in for on CPU (tests/frameworks/test_verl.py): SGLang and vLLM need GPUs.

A module of its own because Ray imports it in the server's actor process (the test's Ray run): only what
that process needs, never the test module itself.
"""

from __future__ import annotations

import base64
from typing import Any

import httpx
import numpy as np

ROUTING = (2, 2)  # layers, top-k of the routed experts the loopback server reports (tests/loopback_model.py)


class LoopbackServer:
    """verl's rollout server's `generate` (verl/workers/rollout/sglang_rollout/async_sglang_server.py, and
    vllm_rollout/vllm_async_server.py for dialect "vllm") over a loopback sglang /generate."""

    def __init__(self, url: str, rollout_config: Any, dialect: str = "sglang"):
        self.url = url
        self.prompt_length = int(rollout_config.prompt_length)
        self.response_length = int(rollout_config.response_length)
        self.max_model_len = int(rollout_config.max_model_len or self.prompt_length + self.response_length)
        self.dialect = dialect
        self.routing = ROUTING if rollout_config.enable_rollout_routing_replay else None
        self.requests: list[dict] = []

    async def generate(self, prompt_ids, sampling_params, request_id, image_data=None, video_data=None, **_):
        from verl.workers.rollout.replica import TokenOutput

        params = dict(sampling_params)
        limit = params.pop("max_new_tokens", None) or params.pop("max_tokens", None)
        if limit is None:
            limit = min(self.response_length, self.prompt_length + self.response_length - len(prompt_ids))
        limit = max(0, min(limit, self.max_model_len - len(prompt_ids) - 1))
        return_logprob = params.pop("logprobs", False)
        body = {"rid": request_id, "input_ids": list(prompt_ids),
                "sampling_params": {**params, "max_new_tokens": limit}, "return_logprob": return_logprob,
                "return_routed_experts": self.routing is not None}
        self.requests.append(body)
        async with httpx.AsyncClient(timeout=60) as client:
            answer = (await client.post(f"{self.url}/generate", json=body)).json()
        meta = answer["meta_info"]
        finish = meta["finish_reason"]["type"]
        pairs = meta["output_token_logprobs"]
        if self.dialect == "vllm":
            finish = "aborted" if finish == "abort" else "completed"
        experts = None
        if self.routing is not None:  # the whole sequence's experts, as SGLang hands them to verl
            raw = base64.b64decode(meta["routed_experts"])
            experts = np.frombuffer(raw, dtype="<i4").reshape(-1, *self.routing)
        return TokenOutput(token_ids=[p[1] for p in pairs], stop_reason=finish, extra_fields={"global_steps": 0},
                           log_probs=[p[0] for p in pairs] if return_logprob else None, routed_experts=experts)
