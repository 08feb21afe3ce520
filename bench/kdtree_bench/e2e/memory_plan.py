"""The GPU-memory plan of the end-to-end speed table: for each row, the weights, the KV cache the
row's requests hold, and whether an `off` and an `on` server fit one GPU together.

SGLang 0.5.23 sizes a server's memory from what is free when it starts (`pre_model_load_memory`,
P): after loading and graph capture it keeps P x (1 - f) free, f being `--mem-fraction-static`,
and gives the KV pools the rest (`kv_pool_runtime.py`). So the first server uses P x f in all,
and the second, starting with P x (1 - f) free, uses P x (1 - f) x f: weights, graphs and
activations, then KV. The second server's room for graphs, activations and KV is therefore
P x f x (1 - f) - weights, at most P / 4 - weights (f = 0.5). A row whose KV and reserve need more
than that runs one server per command (`--modes off`, then `--modes on`), with the room
P x f - weights.

Weights are counted from the checkpoints the harness writes (`make_model`, `make_dflash_draft`),
KV from the pools' cell sizes (MLA: kv_lora + rope per layer; the DFlash draft's MHA: K and V of
hidden size per layer), for batch x (prompt + new tokens + twice the verify width) tokens, the
slots a decode step reserves. Graphs, activations and SGLang's smallest pool are not modelled but
reserved: the room the second 61-layer server had at f 0.3, where it found no KV room (at 0.36 it
started, graphs to batch 8). The first run of a row shows the real figure in its server log
("avail mem" after capture); the reserve should then be replaced by it.

Usage: python -m kdtree_bench.e2e.memory_plan [--write]   (--write: refresh docs/development.md)
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from kdtree_bench.e2e.sglang_servers import kv_tokens_needed, verify_width
from kdtree_bench.models.make_dflash_draft import BLOCK_SIZE, draft_config
from kdtree_bench.models.make_model import model_config, model_weights

DOC = Path(__file__).resolve().parents[3] / "docs" / "development.md"
BEGIN, END = "<!-- memory-plan: begin -->", "<!-- memory-plan: end -->"

GIB = 1 << 30
FREE_AT_START_GIB = 138.07
"""An H200's free memory when the first server starts: SGLang's "avail mem" before loading
weights, in the logs of e2e 36 and 40 (bench/results/sglang_e2e/run36, run40)."""

FREE_AT_START_H100_GIB = 77.85
"""An H100's, in e2e 46's first server log (bench/results/sglang_e2e/run46)."""
STARTED_SERVER_OVERHEAD_GIB = 1.23
"""What a started 4-layer server holds beyond its static share (graphs, activations, CUDA's
context): in e2e 42's logs an H200 had 139.13 GiB free before the first server (f 0.12: a static
share of 16.70) and 121.20 before the second."""
GROUP_CARDS = {"H100": FREE_AT_START_H100_GIB, "H200": FREE_AT_START_GIB}
GROUP_SIZES = (2, 4, 6, 8)
"""Servers a speed run starts together: an off and an on per DDTree budget or algorithm."""

TWO_SERVERS_FRACTION = 0.36
"""The fraction the 61-layer rows have run two servers at."""
TOO_SMALL_FRACTION = 0.3
"""The fraction at which the second 61-layer server found no KV room."""

NEW_TOKENS = 256
KV_BYTES = {"bf16": 2, "fp8": 1}


@dataclass(frozen=True)
class Row:
    preset: str
    layers: int
    spec: str  # eagle, dflash, ddtree
    kv_dtype: str
    batch: int
    prompt: int
    new_tokens: int = NEW_TOKENS

    @property
    def width(self) -> int:
        # EAGLE's rows run its tree; DDTree's the default budget.
        return verify_width("tree" if self.spec == "eagle" else self.spec, BLOCK_SIZE)

    @property
    def label(self) -> str:
        return (
            f"{self.preset}-{self.layers}, {self.spec} {self.kv_dtype}, "
            f"batch {self.batch}, {self.prompt // 1024}k"
        )


def table_rows() -> list[Row]:
    """The rows of the 61-layer headline table, in the order the README shows them."""
    rows = [
        Row("rank", 61, "eagle", "bf16", batch, prompt)
        for batch in (1, 8, 32)
        for prompt in (1024, 8192, 32768)
    ]
    rows.append(Row("rank", 61, "eagle", "bf16", 1, 131072, new_tokens=64))
    rows += [
        Row("rank", 61, spec, kv, batch, prompt)
        for spec, kv in (("dflash", "bf16"), ("ddtree", "bf16"), ("eagle", "fp8"))
        for batch in (1, 8)
        for prompt in (1024, 32768)
    ]
    rows += [Row("kimi-rank", 61, "eagle", "bf16", 1, p) for p in (1024, 32768, 131072)]
    return rows


def weight_bytes(row: Row) -> int:
    """Bytes of the target's and the draft's weights as the servers load them."""
    config = model_config(row.preset, row.layers)
    tensors = model_weights(config, device="meta")
    nextn = f"model.layers.{config['num_hidden_layers']}."
    target = sum(
        t.numel() * t.element_size() for n, t in tensors.items() if not n.startswith(nextn)
    )
    # The NextN layer loads its own embedding and head before SGLang shares the target's: the load
    # needs them (e2e 25's log: 0.56 GiB for the 4-layer NextN, 0.43 without them).
    if row.spec == "eagle":
        shared = ("model.embed_tokens.weight", "lm_head.weight")
        return target + sum(
            t.numel() * t.element_size()
            for n, t in tensors.items()
            if n.startswith(nextn) or n in shared
        )
    draft = draft_config(config)  # the DFlash draft borrows the target's embedding and head
    hidden, inter = draft["hidden_size"], draft["intermediate_size"]
    features = len(draft["dflash_config"]["target_layer_ids"])
    # q, k, v, o; the MLP; fc over the captured features (bf16; norms are negligible)
    return target + 2 * (4 * hidden * hidden + 3 * hidden * inter + features * hidden * hidden)


def kv_bytes_per_token(row: Row) -> int:
    """One token's KV in the target's pool and the draft's."""
    config = model_config(row.preset, row.layers)
    cell = KV_BYTES[row.kv_dtype]
    target = config["num_hidden_layers"] * (config["kv_lora_rank"] + config["qk_rope_head_dim"])
    if row.spec == "eagle":
        draft = config["kv_lora_rank"] + config["qk_rope_head_dim"]  # the one NextN layer
    else:
        dc = draft_config(config)
        draft = dc["num_hidden_layers"] * 2 * dc["num_key_value_heads"] * dc["head_dim"]
    return (target + draft) * cell


def second_room_gib(weights_gib: float, fraction: float) -> float:
    """What the second of two servers at ``fraction`` has for graphs, activations and KV (the
    first one's graphs and activations are in the reserve, not subtracted here)."""
    second = group_static_gib(FREE_AT_START_GIB, fraction, 2, overhead_gib=0.0)[-1]
    return second - weights_gib


def reserve_gib() -> float:
    """Graphs, activations and SGLang's smallest pool: more than the room that was too small."""
    too_small = Row("rank", 61, "eagle", "bf16", 8, 1024)
    return second_room_gib(weight_bytes(too_small) / GIB, TOO_SMALL_FRACTION)


@dataclass(frozen=True)
class Plan:
    row: Row
    weights_gib: float
    kv_gib: float
    reserve_gib: float

    @property
    def layout(self) -> str:
        need = self.kv_gib + self.reserve_gib
        for fraction in (TWO_SERVERS_FRACTION, 0.5):
            if need <= second_room_gib(self.weights_gib, fraction):
                return f"two servers, f {fraction}"
        fraction = (self.weights_gib + need) / FREE_AT_START_GIB
        if fraction > 0.95:
            return "does not fit one H200"
        return f"one server per mode, f {math.ceil(fraction * 100) / 100:.2f}"


def plan(row: Row, reserve: float) -> Plan:
    tokens = kv_tokens_needed(row.batch, row.prompt, row.new_tokens, row.width)
    return Plan(row, weight_bytes(row) / GIB, tokens * kv_bytes_per_token(row) / GIB, reserve)


def group_static_gib(
    free_gib: float, fraction: float, count: int, overhead_gib: float = STARTED_SERVER_OVERHEAD_GIB
) -> list[float]:
    """The static share (weights and KV) of each of ``count`` servers started one after another,
    as the speed harness starts them (each once the one before holds its pools): each takes
    ``fraction`` of what is free, and leaves ``overhead_gib`` more taken once it runs."""
    shares = []
    for _ in range(count):
        shares.append(free_gib * fraction)
        free_gib -= free_gib * fraction + overhead_gib
    return shares


def group_fit(row: Row, count: int, free_gib: float) -> tuple[float, float]:
    """The fraction (in hundredths) that leaves the last of ``count`` servers of ``row`` the most
    KV room, and that room in GiB: the group fits where it is at least the row's KV."""
    weights = weight_bytes(row) / GIB
    rooms = {
        f / 100: group_static_gib(free_gib, f / 100, count)[-1] - weights for f in range(5, 51)
    }
    fraction = max(rooms, key=rooms.__getitem__)
    return fraction, rooms[fraction]


def render_groups() -> str:
    """Which groups of DDTree servers (the 4-layer rank model, batch 1, 128k) fit one card."""
    row = Row("rank", 4, "ddtree", "bf16", 1, 131072)
    kv = plan(row, 0).kv_gib
    lines = [
        f"Servers started together ({row.label}: {weight_bytes(row) / GIB:.1f} GiB of weights "
        f"and {kv:.1f} of KV each; {STARTED_SERVER_OVERHEAD_GIB} GiB more per started server):",
        "",
        "| card | servers | best f | last server's KV room, GiB | fits |",
        "|---|---:|---:|---:|---|",
    ]
    for card, free in GROUP_CARDS.items():
        for count in GROUP_SIZES:
            fraction, room = group_fit(row, count, free)
            lines.append(
                f"| {card} | {count} | {fraction:.2f} | {room:.1f} | "
                f"{'yes' if room >= kv else 'no'} |"
            )
    return "\n".join(lines) + "\n"


def render() -> str:
    reserve = reserve_gib()
    lines = [
        f"Reserve for graphs and activations: {reserve:.1f} GiB; an H200 has "
        f"{FREE_AT_START_GIB} GiB free at the first start.",
        "",
        "| row | weights GiB | KV GiB | second server's room at "
        f"f {TWO_SERVERS_FRACTION} / 0.5, GiB | layout |",
        "|---|---:|---:|---:|---|",
    ]
    for p in (plan(row, reserve) for row in table_rows()):
        rooms = [second_room_gib(p.weights_gib, f) for f in (TWO_SERVERS_FRACTION, 0.5)]
        lines.append(
            f"| {p.row.label} | {p.weights_gib:.1f} | {p.kv_gib:.1f} | "
            f"{rooms[0]:.1f} / {rooms[1]:.1f} | {p.layout} |"
        )
    return "\n".join(lines) + "\n\n" + render_groups()


def with_table(document: str, table: str) -> str:
    """``document`` with the text between its plan markers replaced by ``table``."""
    head, begin, rest = document.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"{DOC.name} lacks the markers {BEGIN} ... {END}")
    return f"{head}{BEGIN}\n{table}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"refresh the table in {DOC.name}")
    args = parser.parse_args(argv)
    table = render()
    if args.write:
        DOC.write_text(with_table(DOC.read_text(), table))
    sys.stdout.write(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
