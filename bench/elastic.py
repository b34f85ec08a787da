"""What an item beyond its slot costs (elastic tensors, app/runtime/spill.py).

    python -m bench.elastic            # 300 requests a case (~1 min)
    python -m bench.elastic --quick    # 50 a case

A Triton-layout repository whose config.pbtxt declares no bound (as Triton's
own examples): `shout` (TYPE_STRING [1] → the string and "!") and `double`
(TYPE_FP32 [-1] → 2x), both ONNX, built here. The daemon's slots hold 256
bytes a string and 4,096 elements an item; longer items are spilled.
Beside each, the same model with its bound declared as large as the
largest case (`shout_bounded`, `double_bounded`): every item in its slot,
the comparison. One client (tritonclient HTTP, binary tensors) sends the
requests of each case one after the other, on one CPU slice (ARENA_SLOTS
64); reported per case and model: the median and 99th-percentile latency
as the client saw it, and which of the request's item and its answer was
spilled (`shout`'s answer is one byte longer); every answer is checked.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.daemon_launcher import free_port, start_daemon, stop_daemon
from bench.progress import say

STRING_CASES = [16, 256, 257, 4096, 65536]  # bytes (the slot holds 256)
LENGTH_CASES = [1000, 4096, 4097, 16384, 262144]  # FP32 elements (the slot holds 4,096)
BOUNDS = (max(STRING_CASES), max(LENGTH_CASES))  # the bounded models' declared bounds
# Slots per model: the bounded `double`'s arena is 2 MiB a slot.
ARENA_SLOTS = 64


def write_repository(repo: Path, bounded: bool = False) -> None:
    """`shout` and `double` in Triton's layout, config.pbtxt without bounds;
    with `bounded`, also `shout_bounded` and `double_bounded`, whose bounds
    are declared as large as the largest case."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper

    def save(name: str, nodes: list, inputs: list, outputs: list, inits: list) -> None:
        graph = helper.make_graph(nodes, name, inputs, outputs, initializer=inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
        model.ir_version = 9
        (repo / name / "1").mkdir(parents=True)
        onnx.save(model, str(repo / name / "1" / "model.onnx"))

    value = helper.make_tensor_value_info
    save(
        "shout",
        [helper.make_node("StringConcat", ["text", "bang"], ["loud"])],
        [value("text", T.STRING, ["n", 1])],
        [value("loud", T.STRING, ["n", 1])],
        [helper.make_tensor("bang", T.STRING, [1], [b"!"])],
    )
    save(
        "double",
        [helper.make_node("Mul", ["x", "two"], ["y"])],
        [value("x", T.FLOAT, ["n", "L"])],
        [value("y", T.FLOAT, ["n", "L"])],
        [helper.make_tensor("two", T.FLOAT, [], [2.0])],
    )
    common = 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
    slo = 'parameters { key: "slo_ms" value { string_value: "20000" } }\n'
    for name, tensors in {
        "shout": ("text", "TYPE_STRING", "[ 1 ]", "loud"),
        "double": ("x", "TYPE_FP32", "[ -1 ]", "y"),
    }.items():
        given, datatype, dims, answer = tensors
        (repo / name / "config.pbtxt").write_text(
            common
            + f'input [{{ name: "{given}" data_type: {datatype} dims: {dims} }}]\n'
            + f'output [{{ name: "{answer}" data_type: {datatype} dims: {dims} }}]\n'
            + slo
        )
    if bounded:
        # The same models with bounds declared as large as the largest case:
        # every item in its slot (and an arena that large).
        for name, bound in (("shout", f"{{text: {BOUNDS[0]}, loud: {BOUNDS[0] + 1}}}"),
                            ("double", f"{{x: [{BOUNDS[1]}], y: [{BOUNDS[1]}]}}")):  # fmt: skip
            key = "max_bytes" if name == "shout" else "max_shape"
            target = repo / f"{name}_bounded"
            (target / "1").mkdir(parents=True)
            (target / "1" / "model.onnx").write_bytes(
                (repo / name / "1" / "model.onnx").read_bytes()
            )
            (target / "config.pbtxt").write_text(
                (repo / name / "config.pbtxt").read_text()
                + f'parameters {{ key: "{key}" value {{ string_value: "{bound}" }} }}\n'
            )


def _case(client: object, model: str, size: int, requests: int) -> tuple[float, float]:
    """Median and p99 latency (ms) of `requests` sequential requests."""
    import tritonclient.http as th

    strings = model.startswith("shout")
    if strings:
        data = np.array([[b"a" * size]], dtype=object)
        given = th.InferInput("text", [1, 1], "BYTES")
        want = data[0, 0] + b"!"
    else:
        data = np.arange(size, dtype=np.float32).reshape(1, size)
        given = th.InferInput("x", [1, size], "FP32")
        want = data * 2
    given.set_data_from_numpy(data, binary_data=True)
    wanted = [th.InferRequestedOutput("loud" if strings else "y", binary_data=True)]
    seconds = []
    for _ in range(requests):
        start = time.perf_counter()
        result = client.infer(model, [given], outputs=wanted)  # type: ignore[attr-defined]
        seconds.append(time.perf_counter() - start)
        if strings:
            assert result.as_numpy("loud")[0, 0] == want, "wrong answer"
        else:
            np.testing.assert_array_equal(result.as_numpy("y"), want)
    ms = np.array(seconds) * 1000
    return float(np.median(ms)), float(np.percentile(ms, 99))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="50 requests a case")
    args = parser.parse_args(argv)
    requests = 50 if args.quick else 300
    import tritonclient.http as th

    with tempfile.TemporaryDirectory(prefix="elastic-") as tmp:
        repo = Path(tmp) / "repo"
        write_repository(repo, bounded=True)
        say("starting the daemon on a Triton repository without declared bounds")
        daemon = start_daemon(
            repo, free_port(), policy="symphony-wc", emulated_devices=0, cpu_slices=1,
            startup_timeout_s=300, extra_env={"ARENA_SLOTS": str(ARENA_SLOTS)},
        )  # fmt: skip
        rows = []
        try:
            client = th.InferenceServerClient(daemon.url.removeprefix("http://"))
            for model, cases, slot in (
                ("shout", STRING_CASES, 256),
                ("double", LENGTH_CASES, 4096),
            ):
                for size in cases:
                    answer = size + 1 if model == "shout" else size  # "!" appended
                    spilled = {(True, True): "in + out", (False, True): "out"}.get(
                        (size > slot, answer > slot), "no"
                    )
                    row: list[object] = [model, size, spilled]
                    for served in (model, f"{model}_bounded"):
                        _case(client, served, size, 5)  # warm-up
                        p50, p99 = _case(client, served, size, requests)
                        row += [p50, p99]
                        say(f"{served} {size}: p50 {p50:.2f} ms, p99 {p99:.2f} ms")
                    rows.append(row)
            client.close()
        finally:
            stop_daemon(daemon)
    print(f"\n{platform.processor() or platform.machine()}, {requests} requests a case\n")
    print("| model | item | spilled | p50 ms | p99 ms | bound declared: p50 ms | p99 ms |")
    print("|---|---|---|---:|---:|---:|---:|")
    for model, size, spilled, p50, p99, b50, b99 in rows:
        unit = "bytes" if model == "shout" else "floats"
        times = " | ".join(f"{ms:.2f}" for ms in (p50, p99, b50, b99))
        print(f"| {model} | {size:,} {unit} | {spilled} | {times} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
