"""Builds the engine from CLI options and serves it with uvicorn (used by ``__main__``)."""

from __future__ import annotations

import argparse
import logging
import threading

import torch

from ..exit_codes import ExitCode
from ..settings import InferenceSettings
from ..sglang.modes import VerifySettings
from ..version import add_version_flag
from .config import (
    ATTENTION_BACKENDS,
    EngineConfig,
    ModelConfig,
    SpecConfig,
    default_attention_backend,
)

log = logging.getLogger("kdtree_inference.engine")


def build_parser(settings: InferenceSettings | None = None) -> argparse.ArgumentParser:
    """The CLI; ``settings`` (default: the environment's) give the defaults KDTREE_* set."""
    settings = InferenceSettings.from_env() if settings is None else settings
    p = argparse.ArgumentParser(
        prog="kdtree-engine",
        description="kdtree's embedded reference inference server: a tiny DeepSeek-V3-shaped MLA "
        "model behind SGLang's HTTP API, with tree speculative decoding over the verify op.",
    )
    add_version_flag(p)
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    p.add_argument("--port", type=int, default=30000, help="port (SGLang's default 30000)")
    p.add_argument(
        "--attention",
        choices=ATTENTION_BACKENDS,
        default=None,
        help="attention backend; default from KDTREE_VERIFY (off -> reference on CPU / triton on "
        "GPU, on -> op, validate -> both, serving the baseline's result)",
    )
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda if available)")
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default=None,
        help="model and KV dtype (default float32 on CPU, bfloat16 on GPU)",
    )
    p.add_argument("--seed", type=int, default=0, help="weight seed: same seed, same model")
    p.add_argument("--num-layers", type=int, default=ModelConfig.num_layers)
    p.add_argument("--num-heads", type=int, default=ModelConfig.num_heads)
    p.add_argument("--hidden-size", type=int, default=ModelConfig.hidden_size)
    p.add_argument(
        "--context-length",
        type=int,
        default=ModelConfig.max_position,
        help="positions the model takes, prompt and output together (SGLang's name); raise it "
        "with --max-prompt-tokens for long-context corpora",
    )
    p.add_argument(
        "--weights-dir",
        default=settings.engine_weights,
        help="load model.safetensors from this directory instead of seeded weights",
    )
    p.add_argument(
        "--speculative-num-draft-tokens",
        type=int,
        default=SpecConfig.num_draft_tokens,
        help="draft tree size incl. its root (SGLang's name); 1 = plain decoding",
    )
    p.add_argument(
        "--speculative-eagle-topk",
        type=int,
        default=SpecConfig.topk,
        help="children per draft-tree node",
    )
    p.add_argument(
        "--speculative-num-steps",
        type=int,
        default=SpecConfig.max_depth,
        help="maximum depth of the draft tree",
    )
    p.add_argument("--max-batch-size", type=int, default=EngineConfig.max_batch_size)
    p.add_argument("--kv-pool-size", type=int, default=EngineConfig.kv_pool_size)
    p.add_argument(
        "--prefill-chunk",
        type=int,
        default=EngineConfig.prefill_chunk,
        help="prompt tokens per prefill forward",
    )
    p.add_argument("--max-prompt-tokens", type=int, default=EngineConfig.max_prompt_tokens)
    p.add_argument("--max-new-tokens-limit", type=int, default=EngineConfig.max_new_tokens_limit)
    p.add_argument(
        "--fault-layer",
        type=int,
        default=None,
        help="TEST ONLY: scale this layer's attention output (a deliberately wrong candidate)",
    )
    p.add_argument(
        "--fault-scale",
        type=float,
        default=None,
        help="TEST ONLY: factor for --fault-layer (required with it)",
    )
    p.add_argument(
        "--incremental-streaming-output",
        action=argparse.BooleanOptionalAction,
        default=EngineConfig.incremental_streaming_output,
        help="stream disjoint segments (SGLang's --incremental-streaming-output); "
        "--no-incremental-streaming-output resends the whole output in every event, "
        "SGLang's default",
    )
    p.add_argument(
        "--attention-kv-splits",
        type=int,
        default=EngineConfig.attention_kv_splits,
        help="reduce attention keys in N chunks merged by log-sum-exp: equivalent "
        "numerics, not bit-identical (the parity gate's A/A' floor); reference only",
    )
    p.add_argument(
        "--decode-step-delay",
        type=float,
        default=EngineConfig.decode_step_delay_s,
        help="TEST/BENCHMARK ONLY: sleep this many seconds after every decode step "
        "(a candidate made slow on purpose); default 0",
    )
    p.add_argument(
        "--warmup-delay",
        type=float,
        default=0.0,
        help="TEST ONLY: seconds to stay not-ready (/health 503) before loading",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=settings.engine_threads,
        help="torch CPU threads (default 1: the model is tiny, and a demo runs two "
        "servers side by side)",
    )
    p.add_argument("--log-level", default="info")
    return p


def config_from_args(
    args: argparse.Namespace, settings: InferenceSettings | None = None
) -> EngineConfig:
    """The engine ``args`` ask for; KDTREE_VERIFY and KDTREE_INJECT_FAULT come from ``settings``
    (default: the environment's)."""
    settings = InferenceSettings.from_env() if settings is None else settings
    if args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    if (args.fault_layer is None) != (args.fault_scale is None):
        raise ValueError("--fault-layer and --fault-scale go together: give both or neither")
    torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    attention = args.attention or default_attention_backend(device, settings.verify)
    dtype = args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    # The SGLang backend's comparison tolerance (its bf16-pool default unless configured).
    tolerance = VerifySettings(atol=settings.verify_atol, rtol=settings.verify_rtol)
    tolerance = tolerance.resolved_for_pool(fp8_pool=False)
    model = ModelConfig(
        seed=args.seed,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        hidden_size=args.hidden_size,
        max_position=args.context_length,
    )
    spec = SpecConfig(
        num_draft_tokens=args.speculative_num_draft_tokens,
        topk=args.speculative_eagle_topk,
        max_depth=args.speculative_num_steps,
    )
    return EngineConfig(
        model=model,
        spec=spec,
        attention=attention,
        device=device,
        dtype=dtype,
        kv_pool_size=args.kv_pool_size,
        max_batch_size=args.max_batch_size,
        prefill_chunk=args.prefill_chunk,
        max_prompt_tokens=args.max_prompt_tokens,
        max_new_tokens_limit=args.max_new_tokens_limit,
        weights_dir=args.weights_dir,
        fault_layer=args.fault_layer,
        fault_scale=1.0 if args.fault_scale is None else args.fault_scale,
        injected_fault=settings.inject_fault,
        incremental_streaming_output=args.incremental_streaming_output,
        warmup_delay_s=args.warmup_delay,
        attention_kv_splits=args.attention_kv_splits,
        decode_step_delay_s=args.decode_step_delay,
        validate_atol=tolerance.atol,
        validate_rtol=tolerance.rtol,
        api_key=None
        if settings.engine_api_key is None
        else settings.engine_api_key.get_secret_value(),
    )


def serve(config: EngineConfig, host: str, port: int, log_level: str = "info") -> int:
    """Run until SIGINT/SIGTERM (exit 0) or until the engine fails to start (exit 1)."""
    import uvicorn

    from .api import EngineAPI
    from .auth import RequireApiKey
    from .fault_injection import log_fault
    from .metrics import EngineMetrics
    from .scheduler import Engine

    engine = Engine(config)
    tolerance = (config.validate_atol, config.validate_rtol)
    api = EngineAPI(engine, EngineMetrics(config.attention, tolerance))
    server = uvicorn.Server(
        uvicorn.Config(
            api.app if config.api_key is None else RequireApiKey(api.app, config.api_key),
            host=host,
            port=port,
            log_level=log_level,
            access_log=False,
            # Idle connections outlive clients' pool expiry (httpx: 5 s, uvicorn's default too), so
            # a client never reuses a connection the server is closing at that moment.
            timeout_keep_alive=75,
            # On SIGTERM, in-flight generations get 5 s; then they are cancelled and the engine
            # stops (a long batch must not keep a stopped server alive).
            timeout_graceful_shutdown=5,
        )
    )

    def watch_startup() -> None:
        while not engine.ready.wait(0.2):
            if engine.failed is not None:
                log.error("engine failed to start, shutting the server down: %s", engine.failed)
                server.should_exit = True
                return

    log.info(
        "kdtree engine: attention=%s device=%s dtype=%s on http://%s:%d",
        config.attention,
        config.device,
        config.dtype,
        host,
        port,
    )
    log_fault(config.injected_fault)
    engine.start()
    threading.Thread(target=watch_startup, daemon=True).start()
    try:
        server.run()
    finally:
        engine.stop()
    return ExitCode.FAILED if engine.failed is not None else ExitCode.OK
