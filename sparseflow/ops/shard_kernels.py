"""Numba kernels of multi-worker sharding: which worker owns a key, and the per-owner buckets
a worker sends its batch's unique keys in (``sparseflow/distributed/sharding.py``)."""

from __future__ import annotations

import numba
import numpy as np

from sparseflow.ops.batch_kernels import gather_rows
from sparseflow.ops.hash_index import mix64
from sparseflow.ops.key_kernels import dedup_tables, table_bounds

_JIT = dict(nogil=True, cache=True, error_model="numpy", boundscheck=False)


@numba.njit(inline="always", **_JIT)
def owner_of_key(key, world, mixed):
    """The worker owning ``key``: ``key mod world`` (non-negative for negative keys, Rec
    SDK's rule), or ``mix64(key) mod world`` when ``mixed`` (for keys whose low bits are
    skewed, e.g. multiples of the world size)."""
    if mixed:
        return np.int32(mix64(key) % np.uint64(world))
    w = np.int64(world)
    r = key % w
    return np.int32(r + w if r < 0 else r)


@numba.njit(**_JIT)
def owners_of(keys, world, mixed, out):
    """out[i] = :func:`owner_of_key` of keys[i]."""
    for i in range(keys.shape[0]):
        out[i] = owner_of_key(keys[i], world, mixed)


@numba.njit(**_JIT)
def bucket_positions(owners, world, width, counts, positions):
    """A stable counting sort by owner: ``counts[w]`` keys go to worker w, and key i lands at
    ``positions[i] = owner * width + its rank among that owner's keys`` of a ``[world,
    width]`` send buffer. Returns False (leaving ``positions`` partial) when an owner gets more
    than ``width`` keys."""
    for w in range(world):
        counts[w] = 0
    for i in range(owners.shape[0]):
        o = owners[i]
        if counts[o] >= width:
            return False
        positions[i] = o * width + counts[o]
        counts[o] += 1
    return True


@numba.njit(**_JIT)
def owned_unique_keys(uniq, weight, starts, n_unique, world, mixed, uniq_all, weight_all,
                      owner_all, table_ends, counts):
    """Every table's unique keys of a deduplicated batch, one table after another, with
    their owners and how many of each table each owner gets: one pass instead of a join, an
    owner rule and a count.

    Args:
      uniq, weight: int64, table t's unique keys and weighted counts at ``starts[t]`` on
        (``n_unique[t]`` of them), as ``dedup_batch`` leaves them.
      world, mixed: the owner rule, as :func:`owner_of_key`.
      uniq_all, weight_all: int64 ``[sum(n_unique)]`` out, the keys and weights joined.
      owner_all: int32 ``[sum(n_unique)]`` out, each key's owner.
      table_ends: int64 ``[T]`` out, table t's exclusive end in the joined arrays.
      counts: int32 ``[world, T]`` out, ``counts[o, t]`` keys of table t owner o gets.
    """
    counts[:, :] = 0
    at = 0
    for t in range(n_unique.shape[0]):
        first = starts[t]
        for u in range(first, first + n_unique[t]):
            k = uniq[u]
            uniq_all[at] = k
            weight_all[at] = weight[u]
            o = owner_of_key(k, world, mixed)
            owner_all[at] = o
            counts[o, t] += 1
            at += 1
        table_ends[t] = at


@numba.njit(**_JIT)
def place_restores(restore, lengths, features, segment_tables, table_firsts, out):
    """Each key's index among every table's unique keys, feature after feature.

    Args:
      restore: int32, the batch's restore vector, one segment per feature in table order
        (feature ``features[j]``'s keys in segment j), indexing its table's unique keys.
      lengths: int64 ``[F]``, keys per feature, in feature order.
      features: int64 ``[F]``, the feature of each segment.
      segment_tables: int64 ``[F]``, the table of each segment.
      table_firsts: int64 ``[T]``, table t's first key among every table's unique keys.
      out: int32 ``[sum(lengths)]`` out, feature 0's keys first.
    """
    n_features = lengths.shape[0]
    offsets = np.zeros(n_features, np.int64)
    for k in range(1, n_features):
        offsets[k] = offsets[k - 1] + lengths[k - 1]
    at = 0
    for j in range(n_features):
        f = features[j]
        to = offsets[f]
        shift = np.int32(table_firsts[segment_tables[j]])
        for i in range(lengths[f]):
            out[to + i] = restore[at + i] + shift
        at += lengths[f]


@numba.njit(**_JIT)
def lay_out_keys(uniq, weight, owners, table_ends, starts, width, send, place):
    """Every table's unique keys into one send buffer: owner o's row holds table 0's keys
    it owns, then table 1's, ... each at ``starts[o, t]`` on, in order. ``send`` int64
    ``[world * width, 2]`` gets (key, weight) at ``o * width + slot``; ``place`` int32
    ``[U, 2]`` gets (o, slot) per unique key. ``starts`` is used as the cursor (changed)."""
    start = 0
    for t in range(table_ends.shape[0]):
        for u in range(start, table_ends[t]):
            o = owners[u]
            slot = starts[o, t]
            starts[o, t] = slot + 1
            position = o * width + slot
            send[position, 0] = uniq[u]
            send[position, 1] = weight[u]
            place[u, 0] = o
            place[u, 1] = slot
        start = table_ends[t]


@numba.njit(**_JIT)
def route_keys(keys, key_ends, coefs, table_segs, features, segment_tables, world, mixed,
               send_count, pad_key, scratch_keys, scratch_tags, generation):
    """One batch's keys laid out by owner, in one call: every table's keys deduplicated
    over its features (:func:`key_kernels.dedup_tables`), their owners counted
    (:func:`owned_unique_keys`), the send buffer's width chosen, the keys laid out
    (:func:`lay_out_keys`) and each key's place among every table's unique keys found
    (:func:`place_restores`). What ``KeyRouter.route`` returns, and what the TF2 faces'
    compiled routing op (``ops/route_ops.py``) outputs.

    Args:
      keys: int64 ``[K]``, every feature's keys, the features in table order
        (``features``).
      key_ends: int64 ``[F]``, each feature's exclusive end in ``keys``.
      coefs: int32 ``[F]``, what one occurrence of each feature counts.
      table_segs: int64 ``[T]``, table t's features end at ``table_segs[t]``.
      features: int64 ``[F]``, the feature (batch order) of each segment.
      segment_tables: int64 ``[F]``, the table of each segment.
      world, mixed: the owner rule (:func:`owner_of_key`).
      send_count: the most unique keys of one table an owner may get (the buffer is
        ``send_count * T`` wide), or -1: as wide as this batch needs (at least 1).
      pad_key: the key of unused slots.
      scratch_keys, scratch_tags, generation: the dedup's scratch
        (:func:`key_kernels.dedup`), at least ``scratch_slots(table_bounds(...)[2])`` long;
        the call stamps ``generation .. generation + T - 1``.

    Returns:
      ``(send, counts, place, gather, sizes, overflow)``: int64 ``send [world * width,
      2]`` (key, weight; padding ``(pad_key, 0)``); int32 ``counts [world, T]``; int32
      ``place [U, 2]`` (owner, slot) of every table's unique keys one table after another;
      int32 ``gather [K]`` each key's index in ``place``, feature 0's keys first; int64
      ``sizes [T + F]``, unique keys per table then keys per feature; ``overflow`` -1, or
      ``owner * T + table`` of the largest count past ``send_count`` (nothing laid out).
    """
    n = keys.shape[0]
    n_tables = table_segs.shape[0]
    n_features = key_ends.shape[0]
    uniq = np.empty(n, np.int64)
    restore = np.empty(n, np.int32)
    weight = np.empty(n, np.int64)
    n_unique = np.zeros(n_tables, np.int64)
    dedup_tables(keys, key_ends, coefs, table_segs, scratch_keys, scratch_tags, generation,
                 uniq, restore, weight, n_unique)
    starts = table_bounds(key_ends, table_segs)[0]   # each table's first key in ``keys``
    total = 0
    for t in range(n_tables):
        total += n_unique[t]
    uniq_all = np.empty(total, np.int64)
    weight_all = np.empty(total, np.int64)
    owner_all = np.empty(total, np.int32)
    table_ends = np.empty(n_tables, np.int64)
    counts = np.empty((world, n_tables), np.int32)
    owned_unique_keys(uniq, weight, starts, n_unique, world, mixed, uniq_all, weight_all,
                      owner_all, table_ends, counts)
    sizes = np.empty(n_tables + n_features, np.int64)
    sizes[:n_tables] = n_unique
    if send_count >= 0:
        largest, overflow = send_count, -1
        for r in range(world):
            for t in range(n_tables):
                if counts[r, t] > largest:
                    largest, overflow = counts[r, t], r * n_tables + t
        if overflow >= 0:
            return (np.empty((0, 2), np.int64), counts, np.empty((0, 2), np.int32),
                    np.empty(0, np.int32), sizes, overflow)
        width = send_count * n_tables
    else:
        width = 1
        for r in range(world):
            row = 0
            for t in range(n_tables):
                row += counts[r, t]
            width = max(width, row)
    cursor = np.empty((world, n_tables), np.int64)   # table t's next slot in owner r's row
    for r in range(world):
        slot = 0
        for t in range(n_tables):
            cursor[r, t] = slot
            slot += counts[r, t]
    send = np.empty((world * width, 2), np.int64)
    send[:, 0] = pad_key
    send[:, 1] = 0
    place = np.empty((total, 2), np.int32)
    lay_out_keys(uniq_all, weight_all, owner_all, table_ends, cursor, width, send, place)
    lengths = np.zeros(n_features, np.int64)
    previous = 0
    for j in range(n_features):
        lengths[features[j]] = key_ends[j] - previous
        previous = key_ends[j]
    sizes[n_tables:] = lengths
    gather = np.empty(n, np.int32)
    place_restores(restore, lengths, features, segment_tables, table_ends - n_unique, gather)
    return send, counts, place, gather, sizes, np.int64(-1)


@numba.njit(**_JIT)
def take_received(received, counts, m):
    """Every table's received entries, one table after another: what an owner's key
    processing takes from an exchange's keys in one call.

    Args:
      received: int64 ``[N * m, 2]``, sender s's row at ``s * m``: every table's
        (key, weight) entries one table after another (``lay_out_keys``'s layout).
      counts: int32 ``[N, T]``, how many entries of sender s's row belong to table t.
      m: the width of a row.

    Returns:
      ``(entries, keys, weights, ends, ok)``: int64 flat positions in ``received``, int64
      keys, int32 weights of table 0's entries (sender after sender), then table 1's, ...;
      int64 ``ends [T]``, table t's exclusive end among them; ``ok`` False (nothing taken)
      when a count is negative, a sender's counts add up past ``m`` or ``received`` has
      fewer than ``N * m`` rows (the counts came from another rank).
    """
    n, n_tables = counts.shape[0], counts.shape[1]
    ends = np.empty(n_tables, np.int64)
    ok = received.shape[0] >= n * m
    for r in range(n):
        row = 0
        for t in range(n_tables):
            ok = ok and counts[r, t] >= 0
            row += counts[r, t]
        ok = ok and row <= m
    if not ok:
        return (np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int32), ends,
                False)
    total = 0
    for t in range(n_tables):
        for r in range(n):
            total += counts[r, t]
        ends[t] = total
    entries = np.empty(total, np.int64)
    keys = np.empty(total, np.int64)
    weights = np.empty(total, np.int32)
    cursor = np.empty(n, np.int64)   # where table t starts in each sender's row
    for r in range(n):
        cursor[r] = r * m
    i = 0
    for t in range(n_tables):
        for r in range(n):
            first = cursor[r]
            for e in range(first, first + counts[r, t]):
                entries[i] = e
                keys[i] = received[e, 0]
                weights[i] = np.int32(received[e, 1])
                i += 1
            cursor[r] = first + counts[r, t]
    return entries, keys, weights, ends, True


@numba.njit(**_JIT)
def scatter_rows(storage, rows, restore, entries, dim, reply):
    """reply[entries[i], :dim] = storage[rows[restore[i]], :dim] (zeros where that row is
    -1): each received entry's embedding at its place. Each unique row is read from the
    cache-cold storage once (a key several workers sent is one read), as ``batch_kernels.expand_tables``."""
    unique = np.empty((rows.shape[0], dim), np.float32)
    gather_rows(storage, rows, dim, unique)
    for i in range(entries.shape[0]):
        u = restore[i]
        e = entries[i]
        for j in range(dim):
            reply[e, j] = unique[u, j]


@numba.njit(**_JIT)
def mark_owned(rows, restore, entries, column, reply):
    """reply[entries[i], column] = 1.0 where the entry's key owns a row (``rows[restore[i]]
    >= 0``), else 0.0: the has-row flag of each received entry."""
    for i in range(entries.shape[0]):
        reply[entries[i], column] = np.float32(1.0) if rows[restore[i]] >= 0 else np.float32(0.0)


@numba.njit(**_JIT)
def sum_entries(grads, entries, restore, dim, out):
    """out[restore[i], :] += grads[entries[i], :dim]: each key's gradient summed over its
    received entries (so over workers); ``out`` float32 ``[U, dim]``, zeroed first."""
    for i in range(entries.shape[0]):
        u = restore[i]
        e = entries[i]
        for j in range(dim):
            out[u, j] += grads[e, j]
