"""Approximate per-feature counting in fixed memory, for inputs whose distinct keys do not fit.

:class:`ApproxFeatureCounter` has the interface of
:class:`~sparseflow.stats.counts.FeatureCounter` (``update``, ``merge``, ``result``) and
produces the same per-feature section (:func:`sparseflow.stats.report.feature_section`), plus
``"mode": "approximate"`` and an ``"error"`` object. Its memory is fixed at construction,
whatever the number of distinct keys (:attr:`ApproxFeatureCounter.nbytes`; 19,979,768 bytes,
about 19 MiB, with the defaults: a 16 KiB HyperLogLog, a 16 MiB count-min sketch, a 3 MiB
distinct sample and 39 KiB of heavy-hitter candidates). The kernels are in :mod:`sparseflow.ops.sketch_kernels`.

How each number is obtained, and its error (n: key occurrences, D: distinct keys)::

    rows, null_rows, empty_rows, total_keys   exact (plain counters)
    distinct_keys        HyperLogLog of 2^precision registers (Ertl's improved estimator):
                         relative standard error 1.04 / sqrt(2^precision), 0.81 % at the
                         default precision 14 (|error| < 2.4 % with probability ~99.7 %)
    top_keys             the heavy-hitter candidates (the ``heavy_hitters`` keys with the
                         largest count-min estimates, kept as the data streams), ranked by
                         their estimates; the listed counts are count-min estimates of a
                         width x depth table, plain update:
                             count <= estimate <= count + (e / width) * n
                         per key with probability >= 1 - exp(-depth) (cms_epsilon = e / width,
                         cms_delta = exp(-depth); 2.6e-6 * n and 1.8 % by default). Every key
                         whose true count exceeds ``heavy_hitter_floor`` is a candidate, so a
                         top-k list is complete when its k-th count is above that floor
                         (top_k is at most ``heavy_hitters``). Counters saturate at 2^32 - 1.
    thresholds, histogram, singleton_keys, eviction
                         from a uniform sample of the distinct keys (a key is sampled iff its
                         hash falls below a threshold that halves whenever the sample would
                         exceed ``sample_size`` keys; a sampled key's count and latest
                         timestamp are exact). A share p of the k sampled keys estimates the
                         share of all distinct keys with relative standard error
                         sqrt((1 - p) / (p k)); the keys (count) it stands for are
                         distinct_keys * p, so the two relative errors add in quadrature:
                             rel. std. error ~ sqrt(1.08 / 2^precision + (1 - p) / (p k))
                         (k is between sample_size / 2 and sample_size once the sample is
                         full: with the defaults, p = 0.1 gives 1.4 - 1.9 %, p = 0.5
                         0.9 - 1.0 %, p = 0.01 4.0 - 5.6 %).
                         Keys whose count is above ``heavy_hitter_floor`` are taken from the
                         heavy-hitter candidates instead (with their count-min estimates), so
                         thresholds above the floor count them one by one. traffic_kept_share
                         at t is 1 - (estimated occurrences of keys with count < t) /
                         total_keys: it depends only on the light keys (counts < t), so its
                         error is that of the sample on them (no heavy key can swing it).
                         The histogram's buckets are rounded estimates (their sum is close to,
                         not exactly, distinct_keys).

While the input has at most ``sample_size`` distinct keys the sample holds every key and the
section is exact (``error.exact`` is true): distinct keys, counts, top keys, thresholds,
histogram and eviction equal those of the exact counter.

Partial counters (per file, per worker) combine with :meth:`ApproxFeatureCounter.merge`: the
HyperLogLog registers, the count-min table and the sample are then exactly those of one pass
over all the data; the heavy-hitter candidates are rebuilt from both sides' candidates.
"""

from __future__ import annotations

import copy
import math

import numpy as np

from sparseflow import validation
from sparseflow.ops import sketch_kernels as sk
from sparseflow.ops import stats_kernels
from sparseflow.ops.count_min import CountMinSketch
from sparseflow.stats import report
from sparseflow.stats.counts import (add_row_counts, check_batch, check_result_options,
                                      top_entries)

MIN_PRECISION, MAX_PRECISION = 4, 18
MAX_HEAVY_HITTERS = 2**20
MIN_SAMPLE, MAX_SAMPLE = 16, 2**24
MAX_SEED = 2**63 - 1

_EMPTY = np.zeros(0, np.int64)


def hll_relative_std_error(precision: int) -> float:
    """The HyperLogLog's relative standard error, ``1.04 / sqrt(2^precision)``."""
    return 1.04 / math.sqrt(2**precision)


def sample_relative_std_error(share: float, sample_keys: int) -> float:
    """Relative standard error of a share ``p`` estimated from ``k`` sampled distinct keys,
    ``sqrt((1 - p) / (p k))`` (inf when p or k is 0)."""
    if share <= 0 or sample_keys <= 0:
        return math.inf
    return math.sqrt((1.0 - share) / (share * sample_keys))


def _check(name: str, value, low: int, high: int) -> int:
    if not validation.is_int(value) or not low <= value <= high:
        validation.fail(name, f"an int in [{low}, {high}]", value)
    return int(value)


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


class ApproxFeatureCounter:
    """Approximate counts of one feature's keys in fixed memory, fed batch by batch.

    See the module docstring for what is estimated how, and the error of each number.

    Attributes (read-only):
      rows, null_rows, empty_rows, total_keys, clock, timed: as
        :class:`~sparseflow.stats.counts.FeatureCounter` (exact).
      distinct_keys: the estimate of the distinct keys (exact while the sample holds them all).
      precision, cms_width, cms_depth, heavy_hitters, sample_size, seed: the configuration.
    """

    def __init__(self, precision: int = 14, cms_width: int = 2**20, cms_depth: int = 4,
                 heavy_hitters: int = 1000, seed: int = 0, timed: bool = False,
                 sample_size: int = 2**16):
        """An empty counter.

        Args:
          precision: p, the HyperLogLog has 2^p one-byte registers; an int in [4, 18].
          cms_width: count-min counters per row; an int in [16, 2^31].
          cms_depth: count-min rows; an int in [1, 16].
          heavy_hitters: heavy-hitter candidates kept (top_k is at most this); an int in
            [1, 2^20].
          seed: hash seed, an int in [0, 2^63 - 1]; counters merge only with the same seed.
          timed: keep the latest timestamp of each sampled key (then every :meth:`update`
            needs timestamps).
          sample_size: the most distinct keys the sample holds; an int in [16, 2^24].

        Raises:
          ValueError: an argument that is not an int in its range (named in the message).
        """
        self.precision = _check("precision", precision, MIN_PRECISION, MAX_PRECISION)
        self.cms_width = _check("cms_width", cms_width, 16, 2**31)
        self.cms_depth = _check("cms_depth", cms_depth, 1, 16)
        self.heavy_hitters = _check("heavy_hitters", heavy_hitters, 1, MAX_HEAVY_HITTERS)
        self.seed = _check("seed", seed, 0, MAX_SEED)
        self.sample_size = _check("sample_size", sample_size, MIN_SAMPLE, MAX_SAMPLE)
        if not isinstance(timed, (bool, np.bool_)):
            validation.fail("timed", "a bool", timed)
        self.timed = bool(timed)
        self.rows = 0
        self.null_rows = 0
        self.empty_rows = 0
        self.total_keys = 0
        self.clock = None
        self._salt = np.uint64(sk.salt_for(np.int64(self.seed), 1))
        self._registers = np.zeros(2**self.precision, np.uint8)
        self._cms = CountMinSketch(self.cms_width, self.cms_depth, self.seed)
        h = self.heavy_hitters
        self._hh_keys = np.zeros(h, np.int64)
        self._hh_vals = np.zeros(h, np.int64)
        self._hh_slot = np.zeros(h, np.int64)
        self._hh_index = np.zeros(_pow2_at_least(2 * h), np.int64)
        self._hh_meta = np.zeros(1, np.int64)
        self._hh_floor = 0   # from merges: keys with a larger count are candidates
        self._sample = np.zeros((_pow2_at_least(2 * self.sample_size), 3), np.int64)
        self._sample_meta = np.zeros(2, np.int64)   # level, keys held

    def __repr__(self) -> str:
        return (f"ApproxFeatureCounter(precision={self.precision}, cms_width={self.cms_width}, "
                f"cms_depth={self.cms_depth}, heavy_hitters={self.heavy_hitters}, "
                f"seed={self.seed}, timed={self.timed}, sample_size={self.sample_size}) "
                f"# {self.nbytes} bytes")

    # --- state ---------------------------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        """Bytes held by the sketches; fixed at construction."""
        return int(self._registers.nbytes + self._cms.counters.nbytes + self._cms.seeds.nbytes
                   + self._hh_keys.nbytes + self._hh_vals.nbytes + self._hh_slot.nbytes
                   + self._hh_index.nbytes + self._hh_meta.nbytes + self._sample.nbytes
                   + self._sample_meta.nbytes)

    @property
    def sample_level(self) -> int:
        """L: each distinct key is in the sample with probability 2^-L (0: every key is)."""
        return int(self._sample_meta[0])

    @property
    def exact(self) -> bool:
        """Whether the sample holds every distinct key seen (then the result is exact)."""
        return self.sample_level == 0

    @property
    def distinct_keys(self) -> int:
        """Distinct keys: exact while :attr:`exact`, else the HyperLogLog estimate."""
        if self.exact:
            return int(self._sample_meta[1])
        return int(round(sk.hll_estimate(self._registers, self.precision)))

    def hll_estimate(self) -> float:
        """The HyperLogLog's estimate of the distinct keys (even while :attr:`exact`)."""
        return float(sk.hll_estimate(self._registers, self.precision))

    def sample_entries(self):
        """(keys, exact counts, latest timestamps) int64 arrays of the sampled keys (slot
        order; timestamps are zeros when not ``timed``)."""
        return stats_kernels.collect_entries(self._sample)

    def heavy_entries(self):
        """(keys, count-min estimates) int64 arrays of the heavy-hitter candidates, estimate
        descending then key ascending."""
        keys = self._hh_keys[:int(self._hh_meta[0])].copy()
        return top_entries(keys, self._cms.estimate(keys), keys.shape[0])

    def heavy_hitter_floor(self) -> int:
        """F: every key whose true count exceeds F is a heavy-hitter candidate (with
        probability 1: the candidates' estimates never under-count)."""
        size = int(self._hh_meta[0])
        heap_min = int(self._hh_vals[0]) if size == self.heavy_hitters else 0
        return max(self._hh_floor, heap_min)

    def error_bounds(self) -> dict:
        """The error parameters of the current state (the ``error`` object of the result)."""
        eps = math.e / self.cms_width
        return {
            "exact": self.exact,
            "hll_relative_std_error": hll_relative_std_error(self.precision),
            "cms_epsilon": eps,
            "cms_delta": math.exp(-self.cms_depth),
            "cms_overcount_bound": self._cms.error_bound(),
            "sample_size": int(self._sample_meta[1]),
            "sample_capacity": self.sample_size,
            "sample_rate": 2.0 ** -self.sample_level,
            "heavy_hitters": self.heavy_hitters,
            "heavy_hitter_floor": self.heavy_hitter_floor(),
        }

    # --- counting ------------------------------------------------------------------------------

    def update(self, keys, row_lengths=None, timestamps=None, null_rows: int = 0) -> None:
        """Counts one batch; arguments and errors as
        :meth:`sparseflow.stats.counts.FeatureCounter.update`."""
        keys, rows, empty, times, latest = check_batch(keys, row_lengths, timestamps,
                                                       null_rows, self.timed)
        n = keys.shape[0]
        if latest is not None:
            self.clock = latest if self.clock is None else max(self.clock, latest)
        sk.hll_sample_update(self._registers, self.precision, self._salt, self._sample,
                             self._sample_meta, self.sample_size, keys, times, self.timed)
        sk.cms_count_offer(self._cms.counters, self._cms.seeds, keys, _EMPTY, *self._hh())
        self._cms.total += n
        self.rows += rows + int(null_rows)
        self.null_rows += int(null_rows)
        self.empty_rows += empty
        self.total_keys += n

    def _hh(self):
        return self._hh_keys, self._hh_vals, self._hh_slot, self._hh_index, self._hh_meta

    def _config(self):
        return (self.precision, self.cms_width, self.cms_depth, self.heavy_hitters, self.seed,
                self.sample_size, self.timed)

    def merge(self, other: "ApproxFeatureCounter") -> None:
        """Adds ``other``'s counts to this counter; ``other`` is unchanged.

        The HyperLogLog registers (maximum), the count-min table (sum, saturating) and the
        sample end exactly as one pass over both inputs would leave them; the heavy-hitter
        candidates are rebuilt from both sides' candidates with the merged estimates (every
        key with a count above :meth:`heavy_hitter_floor` remains a candidate).

        Raises:
          TypeError: ``other`` is not an ApproxFeatureCounter.
          ValueError: ``other`` has another configuration (precision, cms_width, cms_depth,
            heavy_hitters, seed, sample_size, timed).
        """
        if not isinstance(other, ApproxFeatureCounter):
            raise TypeError(f"Argument `other` must be an ApproxFeatureCounter. "
                            f"Received: {type(other).__name__}")
        if other._config() != self._config():
            names = ("precision", "cms_width", "cms_depth", "heavy_hitters", "seed",
                     "sample_size", "timed")
            diff = [f"{k}: {a!r} != {b!r}" for k, a, b in
                    zip(names, self._config(), other._config()) if a != b]
            raise ValueError(f"Argument `other` must have this counter's configuration; "
                             f"differs in {', '.join(diff)}.")
        if other is self:
            other = copy.deepcopy(self)
        floor = self.heavy_hitter_floor() + other.heavy_hitter_floor()
        np.maximum(self._registers, other._registers, out=self._registers)
        sk.saturating_add(self._cms.counters, other._cms.counters)
        self._cms.total += other._cms.total
        sk.sample_merge(self._sample, self._sample_meta, self.sample_size, self._salt,
                        other._sample, np.int64(other._sample_meta[0]))
        candidates = np.concatenate([self._hh_keys[:int(self._hh_meta[0])],
                                     other._hh_keys[:int(other._hh_meta[0])]])
        sk.hh_rebuild(self._cms.counters, self._cms.seeds, candidates, *self._hh())
        self._hh_floor = floor
        add_row_counts(self, other)

    # --- the result ----------------------------------------------------------------------------

    def result(self, top_k: int = 20, max_threshold: int = 10, eviction_window: int | None = None,
               dim: int = 16, optimizer: str = "adam", *, clock: int | None = None,
               encoding: str = "int", multi_hot: bool = False) -> dict:
        """The feature's entry of the stats document, with ``"mode": "approximate"`` and an
        ``"error"`` object (:meth:`error_bounds`).

        Arguments as :meth:`sparseflow.stats.counts.FeatureCounter.result`; ``top_k`` lists
        at most ``heavy_hitters`` keys (while not :attr:`exact`).

        Raises:
          ValueError: an argument out of range, an unknown optimizer, ``eviction_window`` on
            an untimed counter.
        """
        check_result_options(self.timed, top_k, max_threshold, eviction_window, dim,
                             optimizer)
        n_thresholds = int(max_threshold)
        s_keys, s_counts, s_times = self.sample_entries()
        if self.exact:
            distinct = s_keys.shape[0]
            bucket_keys, bucket_traffic, kept_keys, kept_traffic = \
                stats_kernels.summarize_counts(s_counts, n_thresholds)
            top_keys, top_counts = top_entries(s_keys, s_counts, int(top_k))
        else:
            distinct = self.distinct_keys
            scale = distinct / max(1, s_keys.shape[0])
            h_keys, h_counts = self.heavy_entries()
            cutoff = self.heavy_hitter_floor() + 1
            b_keys, b_traffic, below_keys, below_traffic, heavy_kept = sk.approx_summary(
                s_counts, float(scale), h_counts, np.int64(cutoff), n_thresholds)
            bucket_keys = np.rint(b_keys).astype(np.int64)
            bucket_traffic = np.rint(b_traffic).astype(np.int64)
            t = np.arange(n_thresholds + 1)
            kept = np.where(t >= cutoff, heavy_kept, distinct - below_keys)
            kept[0] = distinct
            kept = np.minimum.accumulate(np.clip(kept, 0, distinct))
            kept_keys = np.rint(kept).astype(np.int64)
            traffic = np.minimum.accumulate(np.clip(self.total_keys - below_traffic, 0,
                                                    self.total_keys))
            kept_traffic = np.rint(traffic).astype(np.int64)
            top_keys, top_counts = h_keys[:int(top_k)], h_counts[:int(top_k)]
        eviction = None
        if eviction_window is not None:
            now = clock if clock is not None else self.clock
            now = 0 if now is None else int(now)
            window = int(eviction_window)
            # clock - last < W, written so that it cannot overflow for last <= clock.
            alive = int(np.count_nonzero(s_times > now - window)) \
                if now - window >= np.iinfo(np.int64).min else s_times.shape[0]
            if not self.exact:
                alive = int(round(distinct * alive / max(1, s_times.shape[0])))
            eviction = {"window": window, "clock": now, "keys_alive": alive}
        section = report.feature_section(
            encoding=encoding, multi_hot=multi_hot, rows=self.rows, null_rows=self.null_rows,
            empty_rows=self.empty_rows, total_keys=self.total_keys, distinct_keys=distinct,
            bucket_keys=bucket_keys, bucket_traffic=bucket_traffic, top_keys=top_keys,
            top_counts=top_counts, kept_keys=kept_keys, kept_traffic=kept_traffic,
            eviction=eviction, dim=int(dim), optimizer=optimizer)
        section["mode"] = "approximate"
        section["error"] = self.error_bounds()
        return section
