"""Device-cache policy: hit rate and swap volume as the device tier shrinks (issue 7, part).

One Criteo-sized feature (C3: 10,131,227 ids, Zipf) in batches of 4096 keys, 2 batches in
flight. For device tiers of 100% down to 5% of the distinct keys the stream touches,
``TierCache.place`` maps each batch's unique rows to slots (LRU over the slots no batch in
flight needs). Reported: hit rate (rows already on the device), rows moved per batch, and
placement throughput. Training throughput with tiered tables is bench_tiers.py's.

    .venv/bin/python benchmarks/bench_device_cache.py [--batches 300] [--write]
"""

from __future__ import annotations

import argparse
import time
from collections import deque

import numpy as np
from report import machine_line, replace_section

from sparseflow.pipeline.tier_cache import TierCache
from sparseflow.synthetic import criteo_exponent, zipf_ranks

SECTION = "## Device cache policy: hit rate as the device tier shrinks"
CARDINALITY = 10_131_227
BATCH = 4096
IN_FLIGHT = 2
SHARES = (1.0, 0.5, 0.25, 0.1, 0.05)


def stream(batches: int, seed: int = 0) -> list[np.ndarray]:
    """Each batch's unique rows (the rank of a key stands in for its row)."""
    rng = np.random.default_rng(seed)
    exponent = criteo_exponent(CARDINALITY)
    return [np.unique(zipf_ranks(rng, CARDINALITY, exponent, BATCH)).astype(np.int32)
            for _ in range(batches)]


def run(batches: list[np.ndarray], slots: int, rows: int) -> dict:
    cache = TierCache("C3", slots, rows)
    queue: deque = deque()
    start = time.perf_counter()
    for seq, unique in enumerate(batches):
        cache.place(unique, seq)
        queue.append(seq)
        if len(queue) > IN_FLIGHT:
            cache.pop_plans()
            cache.release(queue.popleft())
            cache.settle()
    seconds = time.perf_counter() - start
    placed = sum(b.shape[0] for b in batches)
    return {"hit_rate": cache.hit_rate, "in_per_batch": cache.swapped_in / len(batches),
            "out_per_batch": cache.swapped_out / len(batches),
            "rows_per_s": placed / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    batches = stream(args.batches)
    distinct = int(np.unique(np.concatenate(batches)).shape[0])
    unique_per_batch = float(np.mean([b.shape[0] for b in batches]))
    lines = ["| device tier | slots | hit rate | rows in / batch | rows out / batch | "
             "placement (M rows/s) |", "|---:|---:|---:|---:|---:|---:|"]
    for share in SHARES:
        slots = max(int(distinct * share), int(unique_per_batch * (IN_FLIGHT + 1)) + 1)
        r = run(batches, slots, CARDINALITY)
        line = (f"| {100 * share:g}% | {slots:,} | {100 * r['hit_rate']:.1f}% | "
                f"{r['in_per_batch']:,.0f} | {r['out_per_batch']:,.0f} | "
                f"{r['rows_per_s'] / 1e6:.1f} |")
        print(line, flush=True)
        lines.append(line)
    text = "\n".join([
        SECTION, "",
        "Command: `.venv/bin/python benchmarks/bench_device_cache.py --write`.", "",
        f"Machine: {machine_line()}.", "",
        f"Stream: {args.batches} batches of {BATCH} Zipf keys of one feature with "
        f"{CARDINALITY:,} ids ({unique_per_batch:,.0f} unique per batch, {distinct:,} "
        f"distinct in all); {IN_FLIGHT} batches in flight; the device tier as a share of the "
        f"distinct keys (never below the unique keys of the batches in flight). The first "
        f"touch of every key is a miss, so even 100% has a hit rate below 1.", "",
        *lines, "",
        "Training throughput with tiered tables: see \"Tiered tables: training throughput "
        "as the fast tier shrinks\".", ""])
    if args.write:
        replace_section(text)
        print("updated BENCHMARKS.md")


if __name__ == "__main__":
    main()
