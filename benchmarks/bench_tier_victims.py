"""The fast tier's victim choice: the LRU list's walk and the one-pass scan against the
numpy formulation they replaced.

A tiered table's cache (``sparseflow/pipeline/tier_cache.py``) picks, for every batch with
misses, the ``n`` slots to empty: those holding a row, pinned by no batch in flight and not
the batch's own, least recently used first (ties by slot). The numpy formulation it used
(kept here as the baseline) builds a mask over every slot, its indices and scores, then
partitions and sorts: five passes over the tier per call. ``tier_kernels.select_victims``
(LFU's choice, and LRU's before the list) counts the scores (a histogram, then a stable
placement) or, in a tier far larger than the victims wanted, keeps them in a heap.
``lru_list.victims`` walks the slots in LRU order from the oldest and stops at the last
victim; the list's upkeep is paid per batch by ``lru_list.touch`` of the batch's slots, which
is timed with it. Each method's victims are checked against a strict (score, slot) sort
first (the baseline breaks ties at its partition's edge by position).

Workload per size: every slot holds a row, 2,000 slots are the batch's own, 1,000 victims
wanted (a batch's misses in ``bench_tiers.py`` are ~900 a table); LRU clocks shared by 1,000
slots each (a batch's slots share its clock). Median of ``--rounds`` calls of each, in turn.

Run: .venv/bin/python benchmarks/bench_tier_victims.py [--rounds 7] [--write]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from report import machine_line, publish  # noqa: E402

from sparseflow.ops import lru_list, tier_kernels  # noqa: E402

SECTION = "## Tiered tables: choosing the fast tier's victims"
SIZES = (23_000, 1_000_000, 10_000_000)
RESIDENT, VICTIMS = 2_000, 1_000


def numpy_victims(pins, row_in, last_used, resident, n):
    """The numpy formulation ``TierCache`` used before the kernel (LRU)."""
    eligible = (pins == 0) & (row_in >= 0)
    eligible[resident] = False
    candidates = np.flatnonzero(eligible)
    score = last_used[candidates]
    pick = np.argpartition(score, n - 1)[:n] if n < candidates.shape[0] \
        else np.arange(candidates.shape[0])
    pick = pick[np.lexsort((candidates[pick], score[pick]))]
    return candidates[pick].astype(np.int32)


_MARKS: dict[int, np.ndarray] = {}   # per tier size: the scratch a TierCache keeps


def kernel_victims(pins, row_in, last_used, resident, n):
    """``tier_kernels.select_victims`` as ``TierCache._victims`` calls it (LRU)."""
    out = np.empty(n, np.int32)
    marks = _MARKS.setdefault(row_in.shape[0], np.zeros(row_in.shape[0], np.bool_))
    eligible = tier_kernels.select_victims(pins, row_in, last_used, np.zeros(0, np.int64),
                                           False, resident, n, out, marks)
    return out[:min(n, eligible)]


def lru_order(last_used: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The LRU list ``TierCache`` would hold for these stamps (every slot holds a row)."""
    slots = last_used.shape[0]
    order = np.lexsort((np.arange(slots), last_used)).astype(np.int32)
    nxt, prv = lru_list.empty(slots)
    chain = np.concatenate([[slots], order, [slots]]).astype(np.int32)
    nxt[chain[:-1]] = chain[1:]
    prv[chain[1:]] = chain[:-1]
    return nxt, prv


def list_victims(lru, pins, resident, n):
    """``lru_list.victims`` as ``TierCache._victims`` calls it, then the batch's slots (its
    own and its victims, now holding its rows) touched, as ``TierCache._assign`` does."""
    out = np.empty(n, np.int32)
    marks = _MARKS.setdefault(pins.shape[0], np.zeros(pins.shape[0], np.bool_))
    eligible = lru_list.victims(*lru, pins, marks, resident, n, 0, out)
    out = out[:min(n, eligible)]
    lru_list.touch(*lru, np.concatenate([resident, out]))
    return out


def state(slots: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    pins = np.zeros(slots, np.int32)
    row_in = np.arange(slots, dtype=np.int32)
    last_used = rng.permutation(slots).astype(np.int64) // 1000
    resident = rng.choice(slots, RESIDENT, replace=False).astype(np.int32)
    return pins, row_in, last_used, resident


def strict_reference(pins, row_in, last_used, resident, n):
    eligible = (pins == 0) & (row_in >= 0)
    eligible[resident] = False
    candidates = np.flatnonzero(eligible)
    return candidates[np.lexsort((candidates, last_used[candidates]))][:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--write", action="store_true", help="record the BENCHMARKS.md section")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    rows = []
    for slots in SIZES:
        pins, row_in, last_used, resident = state(slots)
        want = strict_reference(pins, row_in, last_used, resident, VICTIMS)
        got = kernel_victims(pins, row_in, last_used, resident, VICTIMS)   # compiles
        if not np.array_equal(got, want):
            raise AssertionError(f"kernel victims differ from the reference at {slots} slots")
        if not np.array_equal(list_victims(lru_order(last_used), pins, resident, VICTIMS),
                              want):
            raise AssertionError(f"the list's victims differ from the reference at {slots} "
                                 f"slots")
        # The list moves each call's slots to its newest end: the next call walks past none
        # of them (as the next batch's would).
        lru = lru_order(last_used)
        methods = (("numpy", lambda: numpy_victims(pins, row_in, last_used, resident, VICTIMS)),
                   ("kernel", lambda: kernel_victims(pins, row_in, last_used, resident,
                                                     VICTIMS)),
                   ("list", lambda: list_victims(lru, pins, resident, VICTIMS)))
        times = {name: [] for name, _ in methods}
        for _ in range(args.rounds):
            for name, fn in methods:
                start = time.perf_counter()
                fn()
                times[name].append(1e3 * (time.perf_counter() - start))
        ms = {name: statistics.median(t) for name, t in times.items()}
        scan_speedup = statistics.median([a / b for a, b in zip(times["numpy"],
                                                                 times["kernel"])])
        list_speedup = statistics.median([a / b for a, b in zip(times["kernel"],
                                                                 times["list"])])
        rows.append(f"| {slots:,} | {ms['numpy']:.2f} | {ms['kernel']:.2f} | "
                    f"{scan_speedup:.1f}x | {ms['list']:.3f} | **{list_speedup:.1f}x** |")
        print(rows[-1], flush=True)
    section = "\n".join([
        SECTION, "",
        f"Command: `.venv/bin/python benchmarks/bench_tier_victims.py --rounds {args.rounds} "
        f"--write` (under a minute).", "",
        f"Machine: {machine_line(numpy=np.__version__)}. Load average {load:.2f} at the "
        f"start.", "",
        f"One batch's victim choice in a fast tier of each size: every slot holds a row, "
        f"{RESIDENT:,} slots are the batch's own, {VICTIMS:,} victims wanted (a batch's "
        f"misses in the tiered tables' benchmark are ~900 a table), LRU clocks shared by "
        f"1,000 slots each. Baseline: the numpy formulation `TierCache` used before "
        f"(`numpy_victims` in the script: a mask over the slots, their indices and scores, a "
        f"partition, a sort); the one-pass scan (`tier_kernels.select_victims`, LRU's "
        f"choice until issue 21's twentieth pass and LFU's still); the LRU list "
        f"(`lru_list.victims`, the walk from the oldest slot, timed with the list's upkeep "
        f"for the batch: `lru_list.touch` of its {RESIDENT + VICTIMS:,} slots). Each "
        f"method's victims are checked first against a strict (score, slot) sort. Median of "
        f"{args.rounds} calls each, in turn; each speed-up is the median of the per-call "
        f"ratios.", "",
        "| fast tier slots | numpy, ms a call | scan, ms a call | scan vs numpy | "
        "list walk + upkeep, ms a call | list vs scan |",
        "|---:|---:|---:|---:|---:|---:|",
        *rows, "",
        "The list's cost is the batch's, not the tier's: the walk stops at the last victim "
        "(it passes only the pinned slots and the batch's own on its way, which are among "
        "the newest) and the upkeep relinks the batch's slots at the newest end, in batch order. "
        "Where numpy makes five passes over the slots and three temporaries of the "
        "tier's size, the kernel makes one pass over the slots, which finds the scores' "
        "range and keeps the candidates in a buffer when there are at most 64 per victim; "
        "it then counts them there (a histogram, a stable placement: LRU clocks are shared "
        "by a batch's slots, so the range is narrow). With more candidates per victim a "
        "second pass keeps the victims seen so far in a heap (its memory is the victims', "
        "not the tier's). The batch's own slots are marked in a scratch array the cache "
        "keeps, not sorted and searched. The first row is the size the tiered tables' "
        "benchmark uses at its 10% fast tier. Each batch with misses pays this once per "
        "table.",
    ])
    publish(section, args.write)


if __name__ == "__main__":
    main()
