"""The embedded reference inference engine: a tiny DeepSeek-V3-shaped MLA model served with
SGLang 0.5.23's HTTP API, doing tree speculative decoding over kdtree's verify op.

Modules: config (shapes and limits), tokenizer (bytes), kv_pool (fragmented paged MLA pool),
drafter (n-gram draft trees), attention (reference | op | triton in SGLang's verify layout),
model (the decoder), sampling, scheduler (batching + speculative loop), protocol (request models),
api (FastAPI app), metrics, server/__main__ (CLI), margins (top-1/top-2 margin report),
gpu_parity (op vs triton over a prompt corpus).
"""
