"""A vLLM generation engine (GPU) behind :class:`~rpeg.runtime.engines.base.GenerationEngine`.

``vllm`` is imported lazily (the ``gpu`` extra); without it, constructing the engine raises a
clear :class:`~rpeg.errors.RpegError`. Log-probs: vLLM returns the log-prob of each sampled
token (``logprobs=0`` asks for the sampled token only); with ``logprobs_mode="processed_logprobs"``
unset they are raw-model log-probs -- the trainer recomputes old log-probs with a forward pass
(``algorithm.recompute_old_logprobs``) when generating with vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from rpeg.errors import RpegError
from rpeg.runtime.engines.base import GenerationOutput, SamplingParams


class VLLMEngine:
    """Wraps ``vllm.LLM`` for batched sampling from token-id prompts."""

    def __init__(
        self,
        model_path: str,
        *,
        pad_id: int = 0,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.5,
        tensor_parallel_size: int = 1,
        seed: int = 0,
        policy_version: int = 0,
        **llm_kwargs,
    ):
        try:
            import vllm
        except ImportError:
            raise RpegError(
                "the vLLM engine needs the 'vllm' package (pip install 'rpeg[gpu]' on a CUDA machine); "
                "use the torch engine on CPU"
            ) from None
        self._vllm = vllm
        self.pad_id = pad_id
        self.policy_version = policy_version
        self.llm = vllm.LLM(
            model=model_path,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            seed=seed,
            enable_prefix_caching=True,
            **llm_kwargs,
        )

    def _params(self, p: SamplingParams, cap: int, seed: int | None):
        return self._vllm.SamplingParams(
            n=1,
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k if p.top_k > 0 else -1,
            max_tokens=cap,
            stop_token_ids=list(p.stop_token_ids),
            logprobs=0,
            seed=seed,
            detokenize=False,
        )

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        seed: int | None = None,
        max_new_tokens: Sequence[int] | None = None,
    ) -> GenerationOutput:
        caps = (
            list(max_new_tokens)
            if max_new_tokens is not None
            else [params.max_new_tokens] * len(prompt_ids)
        )
        sps = [
            self._params(params, c, None if seed is None else seed + i) for i, c in enumerate(caps)
        ]
        prompts = [{"prompt_token_ids": list(p)} for p in prompt_ids]
        outs = self.llm.generate(prompts, sps, use_tqdm=False)
        r = max((len(o.outputs[0].token_ids) for o in outs), default=0)
        b = len(outs)
        ids = torch.full((b, r), self.pad_id, dtype=torch.long)
        lps = torch.zeros((b, r), dtype=torch.float32)
        lengths = torch.zeros(b, dtype=torch.long)
        finished = torch.zeros(b, dtype=torch.bool)
        for i, o in enumerate(outs):
            c = o.outputs[0]
            toks = list(c.token_ids)
            n = len(toks)
            lengths[i] = n
            if n:
                ids[i, :n] = torch.tensor(toks)
                if c.logprobs:
                    lps[i, :n] = torch.tensor(
                        [step[t].logprob for step, t in zip(c.logprobs, toks, strict=True)]
                    )
            finished[i] = c.finish_reason == "stop"
        return GenerationOutput(ids, lps, lengths, finished, policy_version=self.policy_version)

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], policy_version: int) -> None:
        """Load new weights into the running engine (in-process executor)."""
        model = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        model.load_weights(weights=list(state_dict.items()))
        self.llm.reset_prefix_cache()
        self.policy_version = policy_version
