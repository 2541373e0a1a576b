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

Then the cache itself: ``bench_tiers.py``'s C3 stream (300 batches of 2048 Zipf keys, rows
given in order of first occurrence) through a ``TierCache`` of 10% and of 100% of its
distinct rows, as the input pipeline and the step drive it (each batch placed early three
batches ahead of its step, its new rows forgotten first; the step claims it, pops the plans,
releases and settles it), against the same cache choosing as before the list
(``ScanTierCache``: the scan for victims and for free slots). Both must end in the same
state. Thread CPU of the placements and claims per batch, median of ``--rounds`` replays of
each, in turn.

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
from sparseflow.pipeline.tier_cache import TierCache  # noqa: E402
from sparseflow.synthetic import criteo_exponent, zipf_ranks  # noqa: E402

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


class ScanTierCache(TierCache):
    """``TierCache`` choosing as before the LRU list (``d9564db``): victims by a scan of every
    slot's stamp, free slots by a scan of every slot. With each slot's stamp its own it makes
    the same choices as ``TierCache``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._lru = None   # no list to keep

    def _victims(self, resident, n, enough=0):
        out = np.empty(n, np.int32)
        eligible = tier_kernels.select_victims(
            self.pins, self.row_in, self.last_used, np.zeros(0, np.int64), False,
            resident.astype(np.int32, copy=False), n, out, self._marks)
        return out[:min(n, eligible)], int(eligible)

    def _free_slots(self, n):
        if not (n and self._n_free):
            return np.zeros(0, np.int32), 0
        return np.flatnonzero(self.row_in < 0)[:n].astype(np.int32), 0


REPLAY_BATCHES, REPLAY_BATCH, C3 = 300, 2048, 10_131_227
AHEAD = 3   # batches the pipeline places before their step: prefetch(2) plus the map's


def replay_stream():
    """Per batch: its unique rows (in order of first occurrence) and its new rows; and the
    distinct rows of the whole stream."""
    keys = zipf_ranks(np.random.default_rng(0), C3, criteo_exponent(C3),
                      REPLAY_BATCHES * REPLAY_BATCH).astype(np.int64)
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    rank = np.empty(first.shape[0], np.int64)
    rank[np.argsort(first)] = np.arange(first.shape[0])
    rows = rank[inverse].astype(np.int32).reshape(REPLAY_BATCHES, REPLAY_BATCH)
    batches, seen = [], 0
    for batch in rows:
        _, at = np.unique(batch, return_index=True)
        unique = batch[np.sort(at)]
        new = unique[unique >= seen]
        seen = max(seen, int(unique.max()) + 1)
        batches.append((unique, new))
    return batches, first.shape[0]


def replay(cache_type, batches, slots, rows):
    """The stream through a cache; returns (placement, claim) thread CPU seconds per batch
    and the cache."""
    cache = cache_type("C3", slots, rows)
    placing = claiming = 0
    n = len(batches)
    for i in range(n + AHEAD):
        if i < n:
            unique, new = batches[i]
            start = time.thread_time()
            with cache.lock:
                cache.forget(new)
            cache.prefetch(unique, i)
            placing += time.thread_time() - start
        j = i - AHEAD
        if j >= 0:
            start = time.thread_time()
            cache.place(batches[j][0], j)
            claiming += time.thread_time() - start
            cache.pop_plans()
            cache.release(j)
            cache.settle()
    return placing / n, claiming / n, cache


def cache_rows(rounds: int) -> list[str]:
    """The replay's table rows: per fast tier share, the list's cache against the scan's."""
    batches, distinct = replay_stream()
    out = []
    for share in (0.1, 1.0):
        slots = int(distinct * share)
        caches = {}
        times = {"list": [], "scan": []}
        for name, cache_type in (("list", TierCache), ("scan", ScanTierCache)):
            caches[name] = replay(cache_type, batches, slots, distinct)[2]   # compiles
        if not (np.array_equal(caches["list"].slot_of, caches["scan"].slot_of)
                and caches["list"].swapped_in == caches["scan"].swapped_in):
            raise AssertionError(f"the list's and the scan's caches differ at {share:.0%}")
        for _ in range(rounds):
            for name, cache_type in (("list", TierCache), ("scan", ScanTierCache)):
                placing, claiming, _ = replay(cache_type, batches, slots, distinct)
                times[name].append((placing, claiming))
        med = {name: [1e6 * statistics.median(t[k] for t in times[name]) for k in (0, 1)]
               for name in times}
        ratio = statistics.median([(a[0] + a[1]) / (b[0] + b[1])
                                   for a, b in zip(times["scan"], times["list"])])
        hit = caches["list"].hit_rate
        out.append(f"| {share:.0%} | {slots:,} | {hit:.1%} | {med['scan'][0]:.0f} + "
                   f"{med['scan'][1]:.0f} | {med['list'][0]:.0f} + {med['list'][1]:.0f} | "
                   f"**{ratio:.2f}x** |")
        print(out[-1], flush=True)
    return out


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
    replayed = cache_rows(args.rounds)
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
        "table.", "",
        f"In the cache: `bench_tiers.py`'s C3 stream ({REPLAY_BATCHES} batches of "
        f"{REPLAY_BATCH:,} Zipf keys) through a `TierCache` as the pipeline and the step "
        f"drive it (each batch placed early {AHEAD} batches ahead of its step, after its new "
        f"rows are forgotten; claimed, its plans popped, released and settled at its step), "
        f"against the same cache choosing by the scans (`ScanTierCache` in the script: the "
        f"victims by `select_victims` over every slot's stamp, the free slots by a scan of "
        f"every slot). Both end in the same state (checked). Thread CPU per batch, "
        f"placement + claim, median of {args.rounds} replays each, in turn; the speed-up is "
        f"the median of the replays' ratios.", "",
        "| fast tier | slots | hit rate | scans, us a batch | list, us a batch | speed-up |",
        "|---:|---:|---:|---:|---:|---:|",
        *replayed,
    ])
    publish(section, args.write)


if __name__ == "__main__":
    main()
