"""Merging the TF2 faces' per-rank files into one process's (sparseflow.tf2.
merge_checkpoint_shards, sparseflow.keras.merge_weight_shards): the joined table against the
shards' union computed here, the rest of the file from rank 0's, and the refusals. The merged
files resuming training exactly: tests/test_tf2_ranks.py."""

import zipfile

import h5py
import numpy as np
import pytest
import tensorflow as tf

from sparseflow.checkpoint.table_state import TableState
from sparseflow.keras import merge_weight_shards
from sparseflow.tf2 import merge_checkpoint_shards
from sparseflow.tf2 import saved_state

GROUP = "layers/sparse_embedding/vars"
SLOTS = ("momentum", "velocity")


def shard_states(n_ranks=2, dim=2):
    """Disjoint shards of one table (key k on rank k mod n), and the whole table."""
    rng = np.random.default_rng(0)
    keys = rng.choice(10_000, 40, replace=False).astype(np.int64)
    whole = TableState(keys=keys, counts=rng.integers(1, 9, 40).astype(np.int32),
                       last_seen=rng.integers(0, 99, 40).astype(np.int64),
                       values=rng.normal(size=(40, dim * 3)).astype(np.float32),
                       slot_names=SLOTS,
                       counted_keys=np.array([10_001, 10_002, 10_003], np.int64),
                       counted_counts=np.array([1, 1, 2], np.int32), clock=77,
                       optimizer_steps=12)

    def part(r, state_keys, field):
        return getattr(whole, field)[state_keys % n_ranks == r]

    shards = []
    for r in range(n_ranks):
        shards.append(TableState(
            keys=part(r, whole.keys, "keys"), counts=part(r, whole.keys, "counts"),
            last_seen=part(r, whole.keys, "last_seen"),
            values=part(r, whole.keys, "values"), slot_names=SLOTS,
            counted_keys=part(r, whole.counted_keys, "counted_keys"),
            counted_counts=part(r, whole.counted_keys, "counted_counts"),
            clock=77 - r, optimizer_steps=12))
    return shards, whole


def assert_whole(state, whole):
    order, ref = np.argsort(state.keys), np.argsort(whole.keys)
    np.testing.assert_array_equal(state.keys[order], whole.keys[ref])
    np.testing.assert_array_equal(state.counts[order], whole.counts[ref])
    np.testing.assert_array_equal(state.last_seen[order], whole.last_seen[ref])
    np.testing.assert_array_equal(state.values[order], whole.values[ref])
    np.testing.assert_array_equal(np.sort(state.counted_keys), np.sort(whole.counted_keys))
    assert tuple(state.slot_names) == SLOTS
    assert state.clock == 77 and state.optimizer_steps == 12


def write_checkpoint(prefix, state, world, dense):
    """A checkpoint laid out as Embedding's: per table `<name>-<field>` tensors under the
    object's attributes, plus a dense variable."""
    names, tensors = [], []
    for field, value in saved_state.checkpoint_arrays(state, world).items():
        names.append(f"embedding/.ATTRIBUTES/t-{field}")
        tensors.append(tf.constant(value, tf.string if field == "slot_names" else None))
    names.append("w/.ATTRIBUTES/VARIABLE_VALUE")
    tensors.append(tf.constant(dense))
    tf.raw_ops.SaveV2(prefix=str(prefix), tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=tensors)
    return str(prefix)


def test_checkpoint_shards_merge_into_the_whole_table_and_rank_zeros_dense_values(tmp_path):
    shards, whole = shard_states()
    prefixes = [write_checkpoint(tmp_path / f"ckpt-rank{r}", s, [r, 2], np.full(3, r, "f4"))
                for r, s in enumerate(shards)]
    merged = merge_checkpoint_shards(prefixes[::-1], tmp_path / "out" / "merged")
    reader = tf.train.load_checkpoint(merged)
    state, world = saved_state.state_from_checkpoint(
        lambda field: reader.get_tensor(f"embedding/.ATTRIBUTES/t-{field}"))
    assert world == [0, 1]                  # no shard mark: restores on any number of ranks
    assert_whole(state, whole)
    np.testing.assert_array_equal(reader.get_tensor("w/.ATTRIBUTES/VARIABLE_VALUE"), [0, 0, 0])


def test_merging_checkpoints_refuses_what_is_not_every_ranks_shard(tmp_path):
    shards, whole = shard_states()
    rank0 = write_checkpoint(tmp_path / "r0", shards[0], [0, 2], np.zeros(3, "f4"))
    rank1 = write_checkpoint(tmp_path / "r1", shards[1], [1, 2], np.zeros(3, "f4"))
    single = write_checkpoint(tmp_path / "one", whole, [0, 1], np.zeros(3, "f4"))
    of_three = write_checkpoint(tmp_path / "r2", shards[1], [2, 3], np.zeros(3, "f4"))
    out = str(tmp_path / "merged")
    with pytest.raises(ValueError, match=r"needs the shards of all 2 ranks, each once; got "
                                         r"ranks \[0\]"):
        merge_checkpoint_shards([rank0], out)
    with pytest.raises(ValueError, match=r"needs the shards of all 2 ranks, each once; got "
                                         r"ranks \[0, 0\]"):
        merge_checkpoint_shards([rank0, rank0], out)
    with pytest.raises(ValueError, match=r"holds one process.s whole table `t` of `embedding`"):
        merge_checkpoint_shards([single, rank1], out)
    with pytest.raises(ValueError, match=r"worlds of different sizes \[2, 3\]"):
        merge_checkpoint_shards([rank0, of_three], out)
    with pytest.raises(ValueError, match=r"Cannot read the checkpoint '.*nowhere'"):
        merge_checkpoint_shards([rank0, str(tmp_path / "nowhere")], out)
    with pytest.raises(ValueError, match=r"`merged_prefix` .* is one of the checkpoints"):
        merge_checkpoint_shards([rank0, rank1], rank1)
    with pytest.raises(ValueError, match=r"Argument `prefixes` must be a list"):
        merge_checkpoint_shards(rank0, out)
    assert not tf.io.gfile.glob(out + "*")      # nothing written by a refused merge


def write_weights(path, state, world, dense):
    """A .weights.h5 file laid out as Keras saves a model holding a SparseEmbedding."""
    with h5py.File(path, "w") as f:
        group = f.create_group(GROUP)
        group["0"] = np.float32(0)                              # the layer's anchor
        for key, value in saved_state.layer_arrays(state, world).items():
            group[key] = value
        f.create_group("layers/dense/vars")["0"] = dense
    return str(path)


def read_weights(file):
    state, world = saved_state.state_from_layer(file[GROUP])
    return state, world, np.asarray(file["layers/dense/vars/0"])


@pytest.mark.parametrize("kind", ["weights.h5", "keras"])
def test_weight_files_merge_into_the_whole_table_and_rank_zeros_dense_weights(tmp_path, kind):
    shards, whole = shard_states()
    paths = []
    for r, s in enumerate(shards):
        h5 = write_weights(tmp_path / f"m{r}.weights.h5", s, [r, 2], np.full((2, 1), r, "f4"))
        if kind == "keras":     # a .keras archive: the config and the weights file
            archive = str(tmp_path / f"m{r}.keras")
            with zipfile.ZipFile(archive, "w") as z:
                z.writestr("config.json", '{"rank": %d}' % r)
                z.write(h5, "model.weights.h5")
            h5 = archive
        paths.append(h5)
    merged = merge_weight_shards(paths[::-1], str(tmp_path / f"merged.{kind}"))
    if kind == "keras":
        with zipfile.ZipFile(merged) as z:
            assert z.read("config.json") == b'{"rank": 0}'
            target = tmp_path / "unpacked.weights.h5"
            target.write_bytes(z.read("model.weights.h5"))
        merged = str(target)
    with h5py.File(merged, "r") as f:
        state, world, dense = read_weights(f)
        assert "world" not in f[GROUP]
    assert world == [0, 1]
    assert_whole(state, whole)
    np.testing.assert_array_equal(dense, np.zeros((2, 1)))


def test_merging_weight_files_refuses_mixed_kinds_and_missing_files(tmp_path):
    shards, _ = shard_states()
    a = write_weights(tmp_path / "a.weights.h5", shards[0], [0, 2], np.zeros((2, 1), "f4"))
    with pytest.raises(ValueError, match=r"must all be .weights.h5 or all .keras files"):
        merge_weight_shards([a, str(tmp_path / "b.weights.h5")], str(tmp_path / "m.keras"))
    with pytest.raises(ValueError, match=r"Cannot read '.*b.weights.h5': no such file"):
        merge_weight_shards([a, str(tmp_path / "b.weights.h5")],
                            str(tmp_path / "m.weights.h5"))
    with pytest.raises(ValueError, match=r"needs the shards of all 2 ranks"):
        merge_weight_shards([a], str(tmp_path / "m.weights.h5"))
    with pytest.raises(ValueError, match=r"is neither a .weights.h5 nor a .keras file"):
        merge_weight_shards([str(tmp_path / "a.h5")], str(tmp_path / "m.h5"))
    assert not (tmp_path / "m.weights.h5").exists()
