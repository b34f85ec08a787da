"""The bundled dynamic models: ONNX models whose execution time depends on
their input (orloj.txt), built in code with `onnx.helper` from a fixed seed
like the other bundled models (app/repository/bundled.py registers them).

`earlyexit`: an early-exit CNN, `input` FP32 [batch, 3, 16, 16] →
`scores` FP32 [batch, 10] and `steps` INT64 [batch, 1].

    A stem (Conv 3×3, 3 → 32 channels, tanh) makes the hidden state h; an
    ONNX `Loop` then applies one block, h ← h + ¼·tanh(Conv3×3(h)), at most
    EARLY_EXIT_MAX_STEPS times. After step t (1, 2, ...) a row's confidence is
    t / (t + ‖x‖²), ‖x‖² the sum of squares of its input (its "difficulty"),
    and the row exits once it reaches EARLY_EXIT_THRESHOLD = ½, that is

        steps(x) = min(EARLY_EXIT_MAX_STEPS, max(1, ⌈‖x‖²⌉)).

    So an input's norm sets how fast its confidence rises, which is how
    orloj.txt's evaluation controls a model's execution time through its
    input; `early_exit_input(steps)` builds one that takes exactly `steps`
    steps (‖x‖² = steps − ½), and random normal inputs (‖x‖² ≈ 768) take
    the maximum, the slowest the model runs (what the latency profile is
    measured on). A row that has exited is frozen (a mask selects its old
    state), so its scores are those at its exit whatever else is in the
    batch; the loop runs while any row is active, so a batch costs about
    c0 + c1·k·max steps (orloj.txt eq. 3–4): every row pays for the slowest.
    `scores` are global average pool + dense 32 → 10 on the exit state;
    `steps` is the number of blocks the row ran.

`earlyexit-wide`: `earlyexit` with a wide head (dense 32 → 4096, ReLU,
4096 → 4096, ReLU, 4096 → 10; EARLY_EXIT_WIDE_HEAD), the same inputs,
outputs and steps. The 4096 × 4096 layer (64 MiB of FP32 weights, more
than a server CPU's last-level cache) is read from memory once per batch
whatever the batch's rows, so a batch has a real fixed cost, c0 > 0 in
orloj.txt's eq. 3 (~8 ms on a 2-core EPYC VM with 32 MiB of L3, against
≈ 0 for `earlyexit`), as a GPU's batch has: batching pays, which is what
Orloj's batch-size choice is for.

`encoder`: a transformer encoder over a variable-length token sequence,
`tokens` INT64 [batch, seq ≤ ENCODER_MAX_LEN] → `hidden` FP32 [batch, seq,
ENCODER_WIDTH] and `pooled` FP32 [batch, ENCODER_WIDTH].

    Token embedding + learned positions, ENCODER_LAYERS post-norm layers
    (4-head self-attention, ReLU feed-forward 4× wide, LayerNormalization).
    Token id 0 is padding: its positions are masked out of every
    attention (−1e9 before the softmax, which underflows to an exact 0) and
    out of `pooled` (the mean of `hidden` over the other positions), so a
    request padded with zeros to a longer batch gets the answer it gets
    alone. Ids outside [0, ENCODER_VOCAB) are clipped into it. The config
    pads `tokens` along the sequence (requests of different lengths share a
    batch padded to its longest, as orloj.txt assumes) and `hidden` follows
    it, so each request gets back its own length. A batch costs about
    c0 + c1·k·(longest length). `encoder_input(length)` builds a request.
    Its latency profile is measured on zeros at the bound (all padding, 128
    long): the same work as any 128 tokens, the slowest the model runs.

Each model's directory also holds `probes.npz`, the representative inputs
whose alone-times seed the scheduler's histograms at start-up (config key
`dynamic`, app/repository/dynamic_fields.py): one array per probe and input,
named `<probe>/<input>`, each a batch of one.
"""

from __future__ import annotations

import io
import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from app.repository.onnx_format import BUILDER_VERSION, IR_VERSION, OPSET, PRODUCER, serialize

EARLY_EXIT_MAX_STEPS = 16
EARLY_EXIT_THRESHOLD = 0.5
EARLY_EXIT_SHAPE = (3, 16, 16)
EARLY_EXIT_CHANNELS = 32
EARLY_EXIT_CLASSES = 10

# earlyexit-wide's head: a 4096 × 4096 FP32 layer (64 MiB), more than this
# class of machine's last-level cache, so every batch reads it from memory
# once whatever its rows: a fixed cost per batch, c0 (orloj.txt eq. 3).
EARLY_EXIT_WIDE_HEAD = 4096

ENCODER_VOCAB = 1000
ENCODER_WIDTH = 128
ENCODER_HEADS = 4
ENCODER_LAYERS = 2
ENCODER_MAX_LEN = 128

# Probes: the steps (earlyexit) and lengths (encoder) whose alone-times
# seed the histograms; spread over the range so the prior has its shape.
EARLY_EXIT_PROBE_STEPS = (1, 2, 4, 6, 8, 12, 16)
ENCODER_PROBE_LENGTHS = (8, 16, 32, 64, 96, 128)


# --------------------------------------------------------------------------- inputs


def early_exit_input(steps: int, seed: int = 0, side: int = EARLY_EXIT_SHAPE[1]) -> np.ndarray:
    """One `earlyexit` request, FP32 [1, 3, side, side] (16 for the bundled
    model), that takes exactly `steps` steps: a random direction scaled to
    ‖x‖² = steps − ½ (half a step of margin either side of the exit rule)."""
    if not 1 <= steps <= EARLY_EXIT_MAX_STEPS:
        raise ValueError(f"steps must be in 1..{EARLY_EXIT_MAX_STEPS}, got {steps}")
    x = np.random.default_rng(seed).standard_normal((1, EARLY_EXIT_SHAPE[0], side, side))
    x *= math.sqrt(steps - 0.5) / np.linalg.norm(x)
    return x.astype(np.float32)


def early_exit_steps(x: np.ndarray) -> np.ndarray:
    """The steps each row of `x` [batch, 3, 16, 16] takes (the rule above)."""
    norm2 = np.square(np.asarray(x, dtype=np.float32)).reshape(len(x), -1).sum(axis=1)
    return np.clip(np.ceil(norm2), 1, EARLY_EXIT_MAX_STEPS).astype(np.int64)


def encoder_input(length: int, seed: int = 0) -> np.ndarray:
    """One `encoder` request, INT64 [1, length], of non-padding token ids."""
    if not 1 <= length <= ENCODER_MAX_LEN:
        raise ValueError(f"length must be in 1..{ENCODER_MAX_LEN}, got {length}")
    rng = np.random.default_rng(seed)
    return rng.integers(1, ENCODER_VOCAB, size=(1, length), dtype=np.int64)


def probe_inputs(model: str) -> list[dict[str, np.ndarray]]:
    """The representative requests of bundled dynamic model `model`."""
    if model in ("earlyexit", "earlyexit-wide"):
        return [{"input": early_exit_input(s, seed=s)} for s in EARLY_EXIT_PROBE_STEPS]
    if model == "encoder":
        return [{"tokens": encoder_input(n, seed=n)} for n in ENCODER_PROBE_LENGTHS]
    raise ValueError(f"no bundled dynamic model {model!r}")


def probes_bytes(probes: list[dict[str, np.ndarray]]) -> bytes:
    """`probes` as an .npz (arrays `<probe>/<input>`); the same probes give
    the same bytes (numpy writes fixed zip timestamps)."""
    buffer = io.BytesIO()
    np.savez(buffer, **{f"{i}/{name}": a for i, p in enumerate(probes) for name, a in p.items()})
    return buffer.getvalue()


# --------------------------------------------------------------------------- builders


class _Graph:
    """Nodes and initializers of a graph under construction; names are
    made unique by a counter, shared with the `outer` graph of a subgraph
    (a Loop body sees the outer graph's names, so they must not clash)."""

    def __init__(self, rng: np.random.Generator, outer: _Graph | None = None) -> None:
        self.rng = rng
        self.outer = outer
        self.nodes: list[onnx.NodeProto] = []
        self.weights: list[onnx.TensorProto] = []
        self._count = 0

    def name(self, prefix: str) -> str:
        if self.outer is not None:
            return self.outer.name(prefix)
        self._count += 1
        return f"{prefix}_{self._count}"

    def const(self, prefix: str, value: np.ndarray) -> str:
        name = self.name(prefix)
        # np.array, not np.ascontiguousarray, which makes a scalar 1-D.
        self.weights.append(numpy_helper.from_array(np.array(value, order="C"), name))
        return name

    def normal(self, prefix: str, shape: tuple[int, ...], scale: float) -> str:
        w = self.rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)
        return self.const(prefix, w)

    def op(
        self, op_type: str, inputs: list[str], prefix: str | None = None, **attrs: object
    ) -> str:
        out = self.name(prefix or op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out


def _model(
    name: str,
    doc: str,
    graph: _Graph,
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
) -> onnx.ModelProto:
    g = helper.make_graph(graph.nodes, name, inputs, outputs, graph.weights, doc_string=doc)
    model = helper.make_model(
        g,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name=PRODUCER,
        producer_version=BUILDER_VERSION,
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def _early_exit_step(
    g: _Graph,
    outer: tuple[str, str, str, str],
    conv: dict[str, object],
    state: list[object],
    batch_dim: str,
) -> onnx.GraphProto:
    """The early-exit loop's body: (iteration, condition, h, active, steps) →
    (any active, h, active, steps). The outer graph's names it uses (`outer`:
    norm2, zero, the block's weight and bias) are visible in it."""
    norm2, zero, block_w, block_b = outer
    b = _Graph(g.rng, outer=g)
    quarter = g.const("quarter", np.array(0.25, np.float32))
    one = g.const("one", np.array(1, np.int64))
    threshold = g.const("threshold", np.array(EARLY_EXIT_THRESHOLD, np.float32))
    update = b.op("Conv", ["h", block_w, block_b], "block", **conv)
    update = b.op("Add", ["h", b.op("Mul", [b.op("Tanh", [update]), quarter])], "updated")
    b.nodes.append(helper.make_node("Where", ["active", update, "h"], ["h_out"], name="freeze"))
    taken = b.op("Cast", ["active"], to=TensorProto.FLOAT)
    b.nodes.append(helper.make_node("Add", ["steps", taken], ["steps_out"], name="count"))
    t = b.op("Cast", [b.op("Add", ["iteration", one])], "t", to=TensorProto.FLOAT)
    confidence = b.op("Div", [t, b.op("Add", [t, norm2])], "confidence")
    done = b.op("GreaterOrEqual", [confidence, threshold], "done")
    b.nodes.append(
        helper.make_node("And", ["active", b.op("Not", [done])], ["active_out"], name="still")
    )
    remaining = b.op("ReduceMax", [b.op("Cast", ["active_out"], to=TensorProto.FLOAT)], keepdims=0)
    b.nodes.append(helper.make_node("Greater", [remaining, zero], ["cond_out"], name="any"))
    mask = [batch_dim, 1, 1, 1]
    body = helper.make_graph(
        b.nodes,
        "early_exit_step",
        [
            helper.make_tensor_value_info("iteration", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h", TensorProto.FLOAT, state),
            helper.make_tensor_value_info("active", TensorProto.BOOL, mask),
            helper.make_tensor_value_info("steps", TensorProto.FLOAT, mask),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, None),
            helper.make_tensor_value_info("h_out", TensorProto.FLOAT, state),
            helper.make_tensor_value_info("active_out", TensorProto.BOOL, mask),
            helper.make_tensor_value_info("steps_out", TensorProto.FLOAT, mask),
        ],
    )
    return body


def _early_exit_head(g: _Graph, pooled: str, channels: int, head_width: int) -> None:
    """The classifier on the pooled state: one dense layer, or with
    `head_width` > 0 the `earlyexit-wide` head (dense 32 → W, ReLU, W → W,
    ReLU, W → 10) that gives a batch a real fixed cost."""
    c = channels
    features = c
    if head_width > 0:
        for i, (fan_in, width) in enumerate(((c, head_width), (head_width, head_width))):
            w = g.normal(f"wide{i}.weight", (fan_in, width), math.sqrt(2.0 / fan_in))
            bias = g.const(f"wide{i}.bias", np.zeros(width, np.float32))
            pooled = g.op("Relu", [g.op("Gemm", [pooled, w, bias], f"wide{i}")], f"wide{i}_relu")
        features = head_width
    head_w = g.normal("head.weight", (features, EARLY_EXIT_CLASSES), math.sqrt(1.0 / features))
    head_b = g.const("head.bias", np.zeros(EARLY_EXIT_CLASSES, np.float32))
    g.nodes.append(helper.make_node("Gemm", [pooled, head_w, head_b], ["scores"], name="head"))


def build_early_exit(
    seed: int = 0,
    *,
    batch_dim: str = "batch",
    channels: int = EARLY_EXIT_CHANNELS,
    side: int = EARLY_EXIT_SHAPE[1],
    head_width: int = 0,
) -> onnx.ModelProto:
    """The `earlyexit` model (see the module docstring). `channels` and
    `side` (the input is [3, side, side]) scale the cost of a step: the
    bundled model is small, bench.orloj_live serves a heavier one.
    `head_width` > 0 gives the `earlyexit-wide` head: dense 32 → W, ReLU,
    W → W, ReLU, W → 10 in place of the one dense layer."""
    g = _Graph(np.random.default_rng(seed))
    c, cin = channels, EARLY_EXIT_SHAPE[0]
    shape = (cin, side, side)
    conv = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    # ‖x‖² per row, kept [batch, 1, 1, 1] to broadcast over the hidden state.
    norm2 = g.op("ReduceSumSquare", ["input"], "norm2", axes=[1, 2, 3], keepdims=1)
    stem_w = g.normal("stem.weight", (c, cin, 3, 3), math.sqrt(2.0 / (cin * 9)))
    stem_b = g.const("stem.bias", np.zeros(c, np.float32))
    h0 = g.op("Tanh", [g.op("Conv", ["input", stem_w, stem_b], "stem", **conv)], "h0")
    zero = g.const("zero", np.array(0.0, np.float32))
    active0 = g.op("GreaterOrEqual", [norm2, zero], "active0")  # every row (NaN: none)
    steps0 = g.op("Mul", [g.op("Cast", [active0], to=TensorProto.FLOAT), zero], "steps0")
    block_w = g.normal("block.weight", (c, c, 3, 3), math.sqrt(2.0 / (c * 9)))
    block_b = g.const("block.bias", np.zeros(c, np.float32))

    outer = (norm2, zero, block_w, block_b)
    body = _early_exit_step(g, outer, conv, [batch_dim, c, side, side], batch_dim)
    trips = g.const("max_steps", np.array(EARLY_EXIT_MAX_STEPS, np.int64))
    go = g.const("go", np.array(True))
    g.nodes.append(
        helper.make_node(
            "Loop",
            [trips, go, h0, active0, steps0],
            ["h_exit", "active_exit", "steps_exit"],
            name="early_exit",
            body=body,
        )
    )
    pooled = g.op("Flatten", [g.op("GlobalAveragePool", ["h_exit"], "gap")], axis=1)
    _early_exit_head(g, pooled, c, head_width)
    flat = g.op("Reshape", ["steps_exit", g.const("rows", np.array([-1, 1], np.int64))])
    g.nodes.append(helper.make_node("Cast", [flat], ["steps"], name="steps", to=TensorProto.INT64))
    return _model(
        "earlyexit-wide" if head_width > 0 else "earlyexit",
        f"early-exit CNN, ≤ {EARLY_EXIT_MAX_STEPS} steps, exit when t/(t+|x|²) ≥ ½, "
        f"head width {head_width or c}, seed {seed}",
        g,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch_dim, *shape])],
        [
            helper.make_tensor_value_info(
                "scores", TensorProto.FLOAT, [batch_dim, EARLY_EXIT_CLASSES]
            ),
            helper.make_tensor_value_info("steps", TensorProto.INT64, [batch_dim, 1]),
        ],
    )


def build_encoder(seed: int = 0, *, batch_dim: str = "batch") -> onnx.ModelProto:
    """The `encoder` model (see the module docstring)."""
    g = _Graph(np.random.default_rng(seed))
    d, heads = ENCODER_WIDTH, ENCODER_HEADS
    dh = d // heads
    ids = g.op(
        "Clip",
        [
            "tokens",
            g.const("id_min", np.array(0, np.int64)),
            g.const("id_max", np.array(ENCODER_VOCAB - 1, np.int64)),
        ],
        "ids",
    )
    valid = g.op("Greater", [ids, g.const("pad_id", np.array(0, np.int64))], "valid")  # [b, L]
    embed = g.normal("embed", (ENCODER_VOCAB, d), 1.0)
    positions = g.normal("positions", (ENCODER_MAX_LEN, d), 0.1)
    length = g.op(
        "Gather", [g.op("Shape", ["tokens"]), g.const("seq_axis", np.array(1, np.int64))], "len"
    )
    pos_ids = g.op(
        "Range",
        [g.const("start", np.array(0, np.int64)), length, g.const("step", np.array(1, np.int64))],
    )
    x = g.op("Add", [g.op("Gather", [embed, ids]), g.op("Gather", [positions, pos_ids])], "x")
    # Additive key mask [b, 1, 1, L]: 0 where valid, −1e9 at padding.
    big = g.const("masked", np.array(-1e9, np.float32))
    zero = g.const("zero", np.array(0.0, np.float32))
    mask = g.op("Where", [valid, zero, big], "mask")
    mask = g.op("Unsqueeze", [mask, g.const("mask_axes", np.array([1, 2], np.int64))], "mask4")
    split = g.const("split_heads", np.array([0, 0, heads, dh], np.int64))
    merge = g.const("merge_heads", np.array([0, 0, d], np.int64))
    scale = g.const("scale", np.array(1.0 / math.sqrt(dh), np.float32))

    def dense(x: str, fan_in: int, fan_out: int, prefix: str) -> str:
        w = g.normal(f"{prefix}.weight", (fan_in, fan_out), math.sqrt(1.0 / fan_in))
        bias = g.const(f"{prefix}.bias", np.zeros(fan_out, np.float32))
        return g.op("Add", [g.op("MatMul", [x, w], prefix), bias])

    def norm(x: str, prefix: str) -> str:
        gamma = g.const(f"{prefix}.gamma", np.ones(d, np.float32))
        beta = g.const(f"{prefix}.beta", np.zeros(d, np.float32))
        return g.op("LayerNormalization", [x, gamma, beta], prefix, axis=-1, epsilon=1e-5)

    for layer in range(ENCODER_LAYERS):
        p = f"layer{layer}"
        q = g.op(
            "Transpose", [g.op("Reshape", [dense(x, d, d, f"{p}.q"), split])], perm=[0, 2, 1, 3]
        )
        k = g.op(
            "Transpose", [g.op("Reshape", [dense(x, d, d, f"{p}.k"), split])], perm=[0, 2, 3, 1]
        )
        v = g.op(
            "Transpose", [g.op("Reshape", [dense(x, d, d, f"{p}.v"), split])], perm=[0, 2, 1, 3]
        )
        scores = g.op("Add", [g.op("Mul", [g.op("MatMul", [q, k]), scale]), mask], f"{p}.scores")
        attn = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
        attn = g.op("Reshape", [g.op("Transpose", [attn], perm=[0, 2, 1, 3]), merge])
        x = norm(g.op("Add", [x, dense(attn, d, d, f"{p}.o")]), f"{p}.norm1")
        ff = dense(g.op("Relu", [dense(x, d, 4 * d, f"{p}.ff1")]), 4 * d, d, f"{p}.ff2")
        x = norm(g.op("Add", [x, ff]), f"{p}.norm2")
    g.nodes.append(helper.make_node("Identity", [x], ["hidden"], name="hidden"))
    keep = g.op("Unsqueeze", [valid, g.const("last", np.array([-1], np.int64))], "keep")
    seq = g.const("seq_axes", np.array([1], np.int64))
    total = g.op("ReduceSum", [g.op("Where", [keep, x, zero]), seq], keepdims=0)
    count = g.op("ReduceSum", [g.op("Cast", [keep], to=TensorProto.FLOAT), seq], keepdims=0)
    count = g.op("Max", [count, g.const("one", np.array(1.0, np.float32))], "count")
    g.nodes.append(helper.make_node("Div", [total, count], ["pooled"], name="pooled"))
    return _model(
        "encoder",
        f"transformer encoder, {ENCODER_LAYERS} layers, width {d}, {heads} heads, "
        f"sequences ≤ {ENCODER_MAX_LEN}, token 0 = padding, seed {seed}",
        g,
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, [batch_dim, "seq"])],
        [
            helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [batch_dim, "seq", d]),
            helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [batch_dim, d]),
        ],
    )


__all__ = [
    "EARLY_EXIT_MAX_STEPS",
    "ENCODER_MAX_LEN",
    "build_early_exit",
    "build_encoder",
    "early_exit_input",
    "early_exit_steps",
    "encoder_input",
    "probe_inputs",
    "probes_bytes",
    "serialize",
]
