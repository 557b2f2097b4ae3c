"""The PagedAttention paper's published figures, as data: every one the course quotes.

Owns ``PAPER`` (value, where in the paper, what it measures) for Kwon et al., "Efficient Memory
Management for Large Language Model Serving with PagedAttention", SOSP 2023, arXiv 2309.06180, and
the launch blog's claims. It never holds our own results: notebooks print ours beside these.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PaperFigure:
    value: float
    where: str  # figure or table
    section: str
    what: str


_F2 = ("share of KV memory, OPT-13B, ShareGPT-like trace"
       " (prior systems: the authors' re-implementation of Orca)")

PAPER: dict[str, PaperFigure] = {
    # Fig. 2: where the KV memory goes
    "max_token": PaperFigure(20.4, "Fig. 2", "§1, measured as in §6.2", "Orca (Max) token states, " + _F2),
    "max_reservation": PaperFigure(13.3, "Fig. 2", "§1", "Orca (Max) reservation, " + _F2),
    "max_internal": PaperFigure(57.3, "Fig. 2", "§1", "Orca (Max) internal fragmentation, " + _F2),
    "max_external": PaperFigure(8.9, "Fig. 2", "§1", "Orca (Max) external fragmentation, " + _F2),
    "pow2_token": PaperFigure(26.8, "Fig. 2", "§1", "Orca (Pow2) token states, " + _F2),
    "pow2_reservation": PaperFigure(17.9, "Fig. 2", "§1", "Orca (Pow2) reservation, " + _F2),
    "pow2_internal": PaperFigure(13.6, "Fig. 2", "§1", "Orca (Pow2) internal fragmentation, " + _F2),
    "pow2_external": PaperFigure(41.6, "Fig. 2", "§1", "Orca (Pow2) external fragmentation, " + _F2),
    "oracle_token": PaperFigure(38.2, "Fig. 2", "§1", "Orca (Oracle) token states, " + _F2),
    "oracle_reservation": PaperFigure(25.2, "Fig. 2", "§1", "Orca (Oracle) reservation, " + _F2),
    "oracle_external": PaperFigure(36.6, "Fig. 2", "§1", "Orca (Oracle) external fragmentation "
                                   "(no internal share is shown), " + _F2),
    "vllm_token": PaperFigure(96.3, "Fig. 2", "§1", "vLLM token states, " + _F2),
    "vllm_waste": PaperFigure(3.7, "Fig. 2", "§1", "vLLM waste, " + _F2),
    # Table 1: the server
    "gpu_memory_gb": PaperFigure(40, "Table 1", "§6.1", "A100 memory for OPT-13B"),
    "weights_gb": PaperFigure(26, "Table 1", "§6.1", "OPT-13B weights"),
    "kv_gb": PaperFigure(12, "Table 1", "§6.1", "memory for the KV cache"),
    "kv_token_slots": PaperFigure(15.7e3, "Table 1", "§6.1", "max # KV cache slots (~15.7K)"),
    # Fig. 13: mean batched requests, OPT-13B, ShareGPT at 2 req/s
    "batch_max": PaperFigure(7.00, "Fig. 13", "§6.2", "Orca (Max) mean batched requests"),
    "batch_pow2": PaperFigure(9.81, "Fig. 13", "§6.2", "Orca (Pow2) mean batched requests"),
    "batch_oracle": PaperFigure(13.62, "Fig. 13", "§6.2", "Orca (Oracle) mean batched requests"),
    "batch_vllm": PaperFigure(30.42, "Fig. 13", "§6.2", "vLLM mean batched requests"),
    # sizes and workloads
    "kv_kb_per_token_opt13b": PaperFigure(800, "text", "§3", "KV cache per token of OPT-13B, KB"),
    "kv_gb_per_request": PaperFigure(1.6, "text", "§3", "KV of one 2048-token OPT-13B request, GB"),
    "sharegpt_prompt_mean": PaperFigure(161.31, "Fig. 11", "§6.1", "ShareGPT mean input tokens"),
    "sharegpt_output_mean": PaperFigure(337.99, "Fig. 11", "§6.1", "ShareGPT mean output tokens"),
    "alpaca_prompt_mean": PaperFigure(19.31, "Fig. 11", "§6.1", "Alpaca mean input tokens"),
    "alpaca_output_mean": PaperFigure(58.45, "Fig. 11", "§6.1", "Alpaca mean output tokens"),
    # block size (§7.2, Fig. 18): the best throughput range, and the default of vLLM v0's design doc
    "best_block_sharegpt_low": PaperFigure(16, "Fig. 18", "§7.2", "best block size on ShareGPT, low end"),
    "best_block_sharegpt_high": PaperFigure(128, "Fig. 18", "§7.2", "best block size on ShareGPT, high end"),
    "best_block_alpaca_low": PaperFigure(16, "Fig. 18", "§7.2", "best block size on Alpaca, low end"),
    "best_block_alpaca_high": PaperFigure(32, "Fig. 18", "§7.2", "best block size on Alpaca, high end"),
    "vllm_default_block_size": PaperFigure(16, "vLLM v0 design doc", "-", "vLLM's default block size"),
    # headline claims
    "throughput_low": PaperFigure(2, "abstract", "abstract", "throughput gain over FasterTransformer "
                                  "and Orca at the same latency, low end"),
    "throughput_high": PaperFigure(4, "abstract", "abstract", "the same, high end"),
    "blog_speedup_vs_hf": PaperFigure(24, "launch blog 2023-06-20", "-", "'up to 24x' throughput "
                                      "against Hugging Face Transformers (a naive baseline)"),
}
