"""Block profiles of a partitioned ONNX model measured on live CPU device
classes, written in the PPipe artifact's layout so that
`app.planning.ppipe.profiles.load_profile(model, DIR)` reads them.

A device class is what an executor of the class runs a block on: an ONNX
Runtime CPU session with `threads` intra-op threads (`cpu2t`: 2 threads,
the fast class; `cpu1t`: 1, the slow one), and optionally an emulated
`slowdown` (every measured time multiplied by it: a device that many times
slower). Class names are letters, digits and `_` only: the artifact's file
names put `-` between model, class and share.

Shares. Share v is 1/v of a device (the artifact's vGPU sizes under MPS);
on a CPU class it is a session with threads / v threads, so v must divide
`threads`. Measured alone: the artifact measures a vGPU while the other
vGPUs of the same GPU run the same model; v CPU sessions side by side
would contend for caches and memory bandwidth in the same way, which these
numbers leave out.

Measurement: for each (class, share) one session per block; for each batch
size b = 1..max_batch, deterministic inputs (app/repository/partition.py)
run through the blocks in order, each block timed on the previous block's
real output: `warmup` untimed runs, then the median of `repeats`. The
defaults are short (it runs in tests with tiny models); raise `--repeats`
for numbers to plan with, on an otherwise idle machine.

Pre-partitioning (`prepartition`) times every segment between consecutive
cut points the same way, at `batch` on one reference class, and groups the
segments into blocks of roughly equal time (`partition_by_runtime`).

Files (µs in the CSVs; seconds in code):

    DIR/block-timing/{model}-{class}-{share}.csv   one row per block, one column per batch size
    DIR/cut-bytes/{model}.csv                      bytes at each of the N − 1 cuts, batch 1
    DIR/partitions/{model}.json                    the boundary tensors (load_partitioning)

    python -m app.repository.block_profile (MODEL.onnx | --chain) --out DIR \\
        [--name NAME] [--blocks 10] [--class NAME:THREADS[:SLOWDOWN]]... \\
        [--shares 1,2] [--reference CLASS] [--max-batch 4] [--warmup 1] [--repeats 3]

`--chain` builds the `chain` model (app/repository/chain_model.py) into
DIR/models/chain/ first. Default classes: cpu2t:2 and cpu1t:1; the
reference class defaults to the one with the fewest threads.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from app.planning.ppipe.profiles import BlockProfile
from app.repository.device_class import DEFAULT_CLASSES, DeviceClass
from app.repository.files import atomic_write_bytes
from app.repository.partition import (
    DEFAULT_BLOCKS,
    Partitioning,
    group_segments,
    load_model,
    partition_by_runtime,
    run,
    save_partitioning,
    segments,
    session,
    synthetic_inputs,
    verify_chain,
)


def _timed(sess: Any, feed: Mapping[str, np.ndarray], warmup: int, repeats: int) -> float:
    """Median seconds of `repeats` runs after `warmup` untimed ones."""
    names = [o.name for o in sess.get_outputs()]
    for _ in range(max(0, warmup)):
        sess.run(names, dict(feed))
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        sess.run(names, dict(feed))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _check_counts(max_batch: int, warmup: int, repeats: int) -> None:
    if max_batch < 1 or warmup < 0 or repeats < 1:
        raise ValueError(
            f"need max_batch ≥ 1, warmup ≥ 0, repeats ≥ 1; got {max_batch}, {warmup}, {repeats}"
        )


def block_seconds(
    partitioning: Partitioning,
    device: DeviceClass,
    share: int = 1,
    *,
    batch_sizes: Sequence[int] = (1,),
    warmup: int = 1,
    repeats: int = 3,
    seed: int = 0,
) -> np.ndarray:
    """Seconds per block (rows) and batch size (columns, `batch_sizes`) on
    1/`share` of `device`, the emulated slowdown applied."""
    _check_counts(max(batch_sizes, default=0), warmup, repeats)
    threads = device.threads_at(share)
    sessions = [
        session(partitioning.extract(k, k + 1), threads) for k in range(partitioning.blocks)
    ]
    table = np.empty((partitioning.blocks, len(batch_sizes)))
    for column, batch in enumerate(batch_sizes):
        tensors = synthetic_inputs(partitioning.model, batch, seed)
        for k, sess in enumerate(sessions):
            feed = {n: tensors[n] for n in partitioning.block_inputs(k)}
            table[k, column] = _timed(sess, feed, warmup, repeats) * device.slowdown
            tensors.update(run(sess, feed))
    return table


def cut_bytes(partitioning: Partitioning, seed: int = 0) -> np.ndarray:
    """Bytes of each boundary tensor for one request (a batch-1 run)."""
    tensors = synthetic_inputs(partitioning.model, 1, seed)
    sizes = []
    for k in range(partitioning.blocks - 1):
        sess = session(partitioning.extract(k, k + 1))
        tensors.update(run(sess, {n: tensors[n] for n in partitioning.block_inputs(k)}))
        sizes.append(tensors[partitioning.boundaries[k]].nbytes)
    return np.asarray(sizes, dtype=float)


def prepartition(
    model: onnx.ModelProto | Path,
    name: str,
    *,
    blocks: int = DEFAULT_BLOCKS,
    reference: DeviceClass = DEFAULT_CLASSES[1],
    batch: int = 1,
    warmup: int = 1,
    repeats: int = 3,
    seed: int = 0,
) -> Partitioning:
    """`model` cut into min(blocks, its segments) blocks of roughly equal
    time on `reference` at `batch` (see the module docstring)."""
    pieces = segments(load_model(model), name)
    times = block_seconds(
        pieces, reference, batch_sizes=(batch,), warmup=warmup, repeats=repeats, seed=seed
    )[:, 0]
    return group_segments(pieces, partition_by_runtime(times, blocks))


def profile_blocks(
    partitioning: Partitioning,
    classes: Sequence[DeviceClass] = DEFAULT_CLASSES,
    *,
    shares: Sequence[int] = (1,),
    max_batch: int = 4,
    warmup: int = 1,
    repeats: int = 3,
    seed: int = 0,
) -> BlockProfile:
    """Every block's latency on every class and share (see `shares` on
    DeviceClass) at batch sizes 1..max_batch, and the bytes at each cut."""
    _check_counts(max_batch, warmup, repeats)
    if not classes:
        raise ValueError("no device classes to profile on")
    names = [c.name for c in classes]
    if len(set(names)) != len(names):
        raise ValueError(f"device class names repeat: {names}")
    latency: dict[tuple[str, int], np.ndarray] = {}
    for device in classes:
        for share in device.shares(shares):
            latency[(device.name, share)] = block_seconds(
                partitioning,
                device,
                share,
                batch_sizes=range(1, max_batch + 1),
                warmup=warmup,
                repeats=repeats,
                seed=seed,
            )
    return BlockProfile(partitioning.name, latency, cut_bytes(partitioning, seed))


def write_profile(profile: BlockProfile, directory: Path) -> list[Path]:
    """Write `profile` in the artifact's layout under `directory` (µs);
    returns the files written."""
    directory = Path(directory)
    (directory / "block-timing").mkdir(parents=True, exist_ok=True)
    (directory / "cut-bytes").mkdir(parents=True, exist_ok=True)
    written = []
    for (cls, share), table in sorted(profile.latency.items()):
        path = directory / "block-timing" / f"{profile.model}-{cls}-{share}.csv"
        rows = [",".join(f"{s * 1e6:.3f}" for s in row) for row in table]
        atomic_write_bytes(path, ("\n".join(rows) + "\n").encode())
        written.append(path)
    path = directory / "cut-bytes" / f"{profile.model}.csv"
    atomic_write_bytes(path, "".join(f"{int(b)}\n" for b in profile.cut_bytes).encode())
    written.append(path)
    return written


# -------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m app.repository.block_profile",
        description="Cut an ONNX model into blocks of roughly equal runtime, check the chained "
        "blocks against the whole model, and profile each block on live CPU device classes "
        "(the PPipe artifact's layout).",
    )
    parser.add_argument("model", nargs="?", type=Path, help="an ONNX file")
    parser.add_argument("--chain", action="store_true", help="build and use the chain model")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--name", help="model name in the files (default: the file's stem)")
    parser.add_argument("--blocks", type=int, default=DEFAULT_BLOCKS)
    parser.add_argument(
        "--class",
        dest="classes",
        action="append",
        metavar="NAME:THREADS[:SLOWDOWN]",
        help="a device class (repeatable; default cpu2t:2 and cpu1t:1)",
    )
    parser.add_argument("--shares", default="1", help="shares to profile, e.g. 1,2 (default 1)")
    parser.add_argument("--reference", help="class whose times cut the blocks")
    parser.add_argument("--max-batch", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.chain == (args.model is not None):
        parser.error("give either an ONNX file or --chain")
    try:
        classes = [DeviceClass.parse(t) for t in args.classes] if args.classes else None
        shares = [int(v) for v in args.shares.split(",") if v.strip()]
    except ValueError as exc:
        parser.error(str(exc))
    classes = classes or list(DEFAULT_CLASSES)
    by_name = {c.name: c for c in classes}
    if args.reference is not None and args.reference not in by_name:
        parser.error(f"--reference {args.reference!r} is not one of {sorted(by_name)}")
    reference = by_name[args.reference] if args.reference else min(classes, key=lambda c: c.threads)
    if args.chain:
        from app.repository.chain_model import CHAIN_MODEL, write_chain

        path = write_chain(args.out / "models" / CHAIN_MODEL, args.seed)
        name = args.name or CHAIN_MODEL
    else:
        path = args.model
        if not path.is_file():
            parser.error(f"{path} is not a file")
        name = args.name or path.stem
    partitioning = prepartition(
        path,
        name,
        blocks=args.blocks,
        reference=reference,
        warmup=args.warmup,
        repeats=args.repeats,
        seed=args.seed,
    )
    verify_chain(partitioning, seed=args.seed)
    profile = profile_blocks(
        partitioning,
        classes,
        shares=shares,
        max_batch=args.max_batch,
        warmup=args.warmup,
        repeats=args.repeats,
        seed=args.seed,
    )
    (args.out / "partitions").mkdir(parents=True, exist_ok=True)
    save_partitioning(partitioning, args.out / "partitions" / f"{name}.json")
    for written in write_profile(profile, args.out):
        print(f"wrote {written}")
    print(f"{name}: {partitioning.blocks} blocks, boundaries {list(partitioning.boundaries)}")
    for cls, share in profile.placements:
        row = " ".join(f"{s * 1e6:.0f}" for s in profile.latency[(cls, share)][:, 0])
        print(f"  {cls}/{share} batch 1, µs per block: {row}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
