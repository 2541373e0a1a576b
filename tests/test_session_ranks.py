"""The Session API (and mx_rec) on several ranks: one model over tables sharded by key.

Each test launches real processes with ``sparseflow launch`` on loopback and compares them
with one process on the same global batches (the reference), or with numpy. The cases of a
parametrized test run one after another in one launch (``tests/workers/sequence.py``: each
its own graph, arguments and sparseflow session; the first in fresh processes), so that the
ranks pay for TensorFlow's import once a test instead of once a case.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.rank_runs import ROOT, require_ok, run_ranks, run_sequence


def _shards(directory, n: int) -> list:
    return [np.load(os.path.join(directory, f"rank{r}.npz")) for r in range(n)]


STEPS, SAVE_AT = 12, 6


@pytest.fixture(scope="module")
def one_and_two_ranks(tmp_path_factory):
    """One process and two ranks train STEPS global batches, each saving after SAVE_AT."""
    one, two = tmp_path_factory.mktemp("one"), tmp_path_factory.mktemp("two")
    run_ranks(["tests.workers.session_ranks", str(one), str(STEPS), "--save-at", str(SAVE_AT),
          "--save-to", str(one / "model")], None)
    run_ranks(["tests.workers.session_ranks", str(two), str(STEPS), "--save-at", str(SAVE_AT),
          "--save-to", str(two / "model")], 2)
    first, second = _shards(one, 1)[0], _shards(two, 2)
    return first, second, one, two


def _worker_runs(tmp_path_factory, cases: dict, ranks: int | None) -> dict:
    """Runs ``tests.workers.session_ranks`` for STEPS steps with each case's flags (label ->
    flags), one case after another in one launch: label -> each rank's shard (list of npz),
    or the test fails with the case's traceback when it is asked for a case that failed."""
    outs = {label: tmp_path_factory.mktemp("case") for label in cases}
    statuses = run_sequence([{"label": label, "module": "tests.workers.session_ranks",
                              "argv": [outs[label], STEPS, *flags]}
                             for label, flags in cases.items()], ranks,
                            tmp_path_factory.mktemp("sequence"))

    def shards(label):
        require_ok(statuses, label)
        return _shards(outs[label], ranks or 1)
    return shards


SHARD_CASES = {"disk": ("--rows", "disk"), "expanding": ("--rows", "expanding"),
               "expanding-modify-graph": ("--rows", "expanding", "--modify-graph"),
               "device": ("--rows", "device"),
               "device-modify-graph": ("--rows", "device", "--modify-graph"),
               "device-over-host-tier": ("--rows", "device-tier"),
               "modify-graph": ("--modify-graph",)}
FROZEN_CASES = {"disk": ("--frozen", "a", "--rows", "disk"),
                "device-tier": ("--frozen", "a", "--rows", "device-tier"),
                "device-tier-modify-graph": ("--frozen", "a", "--rows", "device-tier",
                                             "--modify-graph"),
                "disk-all-bound": ("--frozen", "all", "--rows", "disk"),
                "device-tier-all-bound": ("--frozen", "all", "--rows", "device-tier")}


@pytest.fixture(scope="module")
def shard_runs(tmp_path_factory):
    """Two ranks run every SHARD_CASES case (one launch)."""
    return _worker_runs(tmp_path_factory, SHARD_CASES, 2)


@pytest.fixture(scope="module")
def frozen_runs(tmp_path_factory):
    """Two ranks run every FROZEN_CASES case (one launch), and one process the references
    with host rows (the tiers only change the two-rank runs, so cases share them): (the
    two-rank shards by case, the reference by its flags)."""
    flags = {case: tuple(f for f in FROZEN_CASES[case] if f not in ("--rows", "disk",
                                                                       "device-tier"))
             for case in FROZEN_CASES}
    references = {" ".join(f): f for f in flags.values()}
    two = _worker_runs(tmp_path_factory, FROZEN_CASES, 2)
    one = _worker_runs(tmp_path_factory, references, None)
    return two, lambda case: one(" ".join(flags[case]))[0]


def _merged(shards: list, table: str) -> dict:
    """The shards' states of ``table`` as one, sorted by key."""
    keys = np.concatenate([s[f"{table}/keys"] for s in shards])
    order = np.argsort(keys)
    return {name: np.concatenate([s[f"{table}/{name}"] for s in shards])[order]
            for name in ("keys", "weights", "momentum", "velocity", "counts", "last_seen")}


def test_two_ranks_lose_what_one_rank_loses_on_the_same_global_batches(one_and_two_ranks):
    one, two = one_and_two_ranks[:2]
    assert int(two[0]["size"]) == 2 and int(one["size"]) == 1
    for shard in two:
        np.testing.assert_allclose(shard["losses"], one["losses"], rtol=0, atol=1e-5)
        np.testing.assert_allclose(shard["w"], one["w"], rtol=0, atol=1e-5)
    assert one["losses"][-1] < one["losses"][0]


@pytest.mark.parametrize("table", ["a", "b"])
def test_every_key_lives_in_its_owners_shard_with_one_ranks_row_slots_and_counts(
        one_and_two_ranks, table):
    one, two = one_and_two_ranks[:2]
    keys = [shard[f"{table}/keys"] for shard in two]
    for rank, owned in enumerate(keys):
        assert (owned % 2 == rank).all()
    merged = np.concatenate(keys)
    order = np.argsort(merged)
    np.testing.assert_array_equal(merged[order], one[f"{table}/keys"])
    assert len(one[f"{table}/keys"]) > 50
    for name in ("weights", "momentum", "velocity", "counts", "last_seen"):
        ours = np.concatenate([shard[f"{table}/{name}"] for shard in two])[order]
        np.testing.assert_allclose(ours, one[f"{table}/{name}"], rtol=0, atol=1e-5,
                                   err_msg=name)
    counted = np.sort(np.concatenate([shard[f"{table}/counted"] for shard in two]))
    np.testing.assert_array_equal(counted, one[f"{table}/counted"])
    for shard in two:
        assert int(shard[f"{table}/clock"]) == int(one[f"{table}/clock"])
        assert int(shard[f"{table}/steps"]) == int(one[f"{table}/steps"])


@pytest.mark.parametrize("case", [c for c in SHARD_CASES if c != "modify-graph"])
def test_shards_over_a_disk_tier_or_growing_train_like_one_process(one_and_two_ranks,
                                                                   shard_runs, case):
    """Table a's shards keep 120 rows in memory over a disk tier (rows move between them
    every step), every table grows (dynamic expansion, trained by a by-address optimizer,
    in FeatureSpec mode and through automatic graph modification), every table keeps its
    shard in TF variables (device rows, read and updated by TF ops at the owner), or table
    a keeps 120 device slots over host homes (Rec SDK's DDR mode on a GPU): two ranks still
    train exactly as one process with plain host rows."""
    one = one_and_two_ranks[0]
    rows = SHARD_CASES[case][1]
    two = shard_runs(case)
    for shard in two:
        np.testing.assert_allclose(shard["losses"], one["losses"], rtol=0, atol=1e-5)
    for table in ("a", "b"):
        merged = _merged(two, table)
        np.testing.assert_array_equal(merged["keys"], one[f"{table}/keys"])
        for name in ("weights", "momentum", "velocity", "counts", "last_seen"):
            np.testing.assert_allclose(merged[name], one[f"{table}/{name}"], rtol=0,
                                       atol=1e-5, err_msg=f"{table}/{name}")
    if rows in ("disk", "device-tier"):   # more keys than fast rows in a shard: tier used
        assert all(len(shard["a/keys"]) > 120 for shard in two)
    for shard in two:
        assert str(shard["a/rows_on"]) == ("host" if rows in ("disk", "expanding")
                                           else "device")


@pytest.mark.parametrize("case", list(FROZEN_CASES))
def test_a_frozen_tiered_shard_pins_no_batch_and_stays_as_initialised(frozen_runs, case):
    """Table a is looked up with is_grad=False and no update trains it (with frozen "all",
    neither table is, though both were created with a sparse optimizer, so that the batch
    sends no gradient to the owners at all). Its tiered shards claimed each batch's fast
    slots as a training batch's, pinned until an update that never came: CacheFullError by
    the fourth step (before this was mended). Its claims are now an evaluation's, unpinned
    at the release: two ranks train as one process with host rows does, and a's rows stay
    as they were initialised."""
    two, one = frozen_runs[0](case), frozen_runs[1](case)
    for shard in two:
        np.testing.assert_allclose(shard["losses"], one["losses"], rtol=0, atol=1e-5)
    b = _merged(two, "b")
    for name in ("keys", "weights", "momentum", "velocity", "counts", "last_seen"):
        np.testing.assert_allclose(b[name], one[f"b/{name}"], rtol=0, atol=1e-5, err_msg=name)
    keys = np.concatenate([shard["a/keys"] for shard in two])
    order = np.argsort(keys)
    np.testing.assert_array_equal(keys[order], one["a/keys"])
    np.testing.assert_array_equal(np.concatenate([shard["a/weights"] for shard in two])[order],
                                  one["a/weights"])
    if "a/momentum" in one:   # bound to an optimizer (frozen "all"), never applied
        assert not np.any(one["a/momentum"]) and not np.any(one["a/velocity"])
    assert all(len(shard["a/keys"]) > 120 for shard in two)   # more keys than fast slots


@pytest.fixture(scope="module")
def restore_runs(tmp_path_factory, one_and_two_ranks):
    """The restores from SAVE_AT: two ranks resume the one process's checkpoint, save with
    device rows and resume that (one launch); one process resumes the two ranks' checkpoint
    and the device rows' one (one process). Returns the runs' shards by label."""
    _, _, one_dir, two_dir = one_and_two_ranks
    saved = tmp_path_factory.mktemp("device-rows") / "model"
    prefix = f"{saved}-0-{SAVE_AT}"
    resume = ("--start", SAVE_AT, "--restore")
    two = _worker_runs(tmp_path_factory, {
        "1->2": (*resume, one_dir / f"model-0-{SAVE_AT}"),
        "device save": ("--rows", "device", "--save-at", SAVE_AT, "--save-to", saved),
        "device resume": ("--rows", "device", *resume, prefix)}, 2)
    one = _worker_runs(tmp_path_factory, {"2->1": (*resume, two_dir / f"model-0-{SAVE_AT}"),
                                          "device resume alone": (*resume, prefix)}, None)
    return lambda label: one(label) if label in ("2->1", "device resume alone") else two(label)


def test_device_row_shards_save_and_resume_on_two_ranks_and_in_one_process(
        one_and_two_ranks, restore_runs):
    """Shards in TF variables saved after step 6 resume exactly, on 2 ranks with device rows
    and in one process with host rows (the checkpoint holds rows by key)."""
    one = one_and_two_ranks[0]
    restore_runs("device save")   # it ran
    for shard in restore_runs("device resume") + restore_runs("device resume alone"):
        np.testing.assert_allclose(shard["losses"], one["losses"][SAVE_AT:], rtol=0,
                                   atol=1e-5)


def test_table_a_admits_keys_on_the_counts_of_every_rank(one_and_two_ranks):
    one = one_and_two_ranks[0]
    # Keys seen once by the global batches stay out (threshold 2): some are counted only.
    assert len(one["a/counted"]) > 0


@pytest.mark.parametrize("direction", ["1->2", "2->1"])
def test_a_checkpoint_resumes_on_another_number_of_ranks_exactly(one_and_two_ranks,
                                                                 restore_runs, direction):
    """Restored from SAVE_AT on the other number of ranks, the rest of the training loses
    and ends as the uninterrupted one-process run."""
    one = one_and_two_ranks[0]
    resumed = restore_runs(direction)
    for shard in resumed:
        np.testing.assert_allclose(shard["losses"], one["losses"][SAVE_AT:], rtol=0,
                                   atol=1e-5)
    for table in ("a", "b"):
        ours, reference = _merged(resumed, table), _merged([one], table)
        for name, value in reference.items():
            np.testing.assert_allclose(ours[name], value, rtol=0, atol=1e-5, err_msg=name)
        for rank, shard in enumerate(resumed):
            assert (shard[f"{table}/keys"] % len(resumed) == rank).all()


def test_graph_modification_on_two_ranks_trains_what_feature_specs_train_on_one(
        one_and_two_ranks, shard_runs):
    """The same model through automatic graph modification (raw-id lookups, thresholds per
    lookup, the timestamp from ASCEND_TIMESTAMP) on two ranks."""
    one = one_and_two_ranks[0]
    two = shard_runs("modify-graph")
    for shard in two:
        np.testing.assert_allclose(shard["losses"], one["losses"], rtol=0, atol=1e-5)
    for table in ("a", "b"):
        ours, reference = _merged(two, table), _merged([one], table)
        for name, value in reference.items():
            np.testing.assert_allclose(ours[name], value, rtol=0, atol=1e-5, err_msg=name)


def test_collective_steps_start_no_thread_per_collective(one_and_two_ranks):
    """A timeout on each collective op made TensorFlow start a thread per op run that slept
    out the timeout (300 s): ~15 threads a step, 8,000 after 40 s of a 2-rank job, enough to
    exhaust a machine's pids (32,768 here) within minutes. The timeout is the step's now."""
    for shard in one_and_two_ranks[1]:
        after_second, at_end = (int(n) for n in shard["threads"])
        assert at_end - after_second < STEPS - 2, shard["threads"]


def test_each_rank_writes_its_shard_and_names_every_shard(one_and_two_ranks):
    import json

    two_dir = one_and_two_ranks[3]
    for rank in range(2):
        with open(two_dir / f"sparse-model-{rank}-{SAVE_AT}" / "manifest.json") as f:
            world = json.load(f)["world"]
        assert world == {"rank": rank, "size": 2, "hash": "mod",
                         "shards": [f"sparse-model-0-{SAVE_AT}", f"sparse-model-1-{SAVE_AT}"]}


def test_a_killed_rank_ends_the_others_naming_the_last_checkpoint_which_resumes_exactly(
        one_and_two_ranks, tmp_path):
    """Rank 1 dies before step 9; rank 0's next collective gives up after
    SPARSEFLOW_COLLECTIVE_TIMEOUT (the launcher's grace is longer), naming the checkpoint of
    step SAVE_AT, from which a rerun trains on exactly."""
    import time

    one = one_and_two_ranks[0]
    begin = time.monotonic()
    # A grace well past the collective timeout: the launcher must not end rank 0 before its
    # own error (it did once, the two being equal).
    done = run_ranks(["tests.workers.session_ranks", str(tmp_path), str(STEPS), "--save-at",
                 str(SAVE_AT), "--save-to", str(tmp_path / "model"), "--die-at", "9"], 2,
                check=False, grace=30, SPARSEFLOW_COLLECTIVE_TIMEOUT="10")
    # the first rank to fail: the killed one
    assert done.returncode == 7, done.stdout[-3000:] + done.stderr[-2000:]
    assert time.monotonic() - begin < 90
    assert "rank 1 exited with status 7" in done.stderr
    prefix = str(tmp_path / f"model-0-{SAVE_AT}")
    assert ("[rank 0] sparseflow.distributed.graph_world.RankLostError: Rank 0 of 2: a "
            "collective among the ranks did not complete") in done.stdout
    assert (f"(collectives wait 10 s, SPARSEFLOW_COLLECTIVE_TIMEOUT). The last checkpoint every "
            f"rank completed: {prefix} (restore it on a rerun to resume)") in done.stdout
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    run_ranks(["tests.workers.session_ranks", str(resumed), str(STEPS), "--restore", prefix,
          "--start", str(SAVE_AT)], 2)
    for shard in _shards(resumed, 2):
        np.testing.assert_allclose(shard["losses"], one["losses"][SAVE_AT:], rtol=0,
                                   atol=1e-5)


def test_ranks_given_one_save_path_are_refused_naming_it(tmp_path):
    """Every rank saves its shard: one path for all would have each rank's shard replace
    another's. Each rank refuses (the same gathered paths everywhere) before writing."""
    done = run_ranks(["tests.workers.session_ranks", tmp_path, 4, "--save-at", 2,
                      "--save-to", tmp_path / "model", "--shared-prefix"], 2, check=False)
    assert done.returncode != 0
    for rank in range(2):
        assert (f"[rank {rank}] ValueError: Argument `save_path` must be a path of its own on "
                f"each of the 2 ranks") in done.stdout
    assert not any(name.startswith("sparse-") for name in os.listdir(tmp_path))


def test_broadcast_checks_its_root_rank():
    import tensorflow as tf

    from sparseflow.distributed import collectives

    with tf.Graph().as_default():
        x = tf.constant([1.0])
        assert collectives.broadcast(x, 0) is x
        with pytest.raises(ValueError, match=r"`root_rank` must be an int in \[0, 0\]"):
            collectives.broadcast(x, 1)


def test_collective_timeout_is_read_and_checked():
    from sparseflow.distributed.graph_world import collective_timeout

    assert collective_timeout({}) == 300.0
    assert collective_timeout({"SPARSEFLOW_COLLECTIVE_TIMEOUT": "2.5"}) == 2.5
    for bad in ("0", "-1", "soon", "1e9"):
        with pytest.raises(ValueError, match=rf"SPARSEFLOW_COLLECTIVE_TIMEOUT must be a number "
                                             rf"of seconds in \(0, 86400\]; received '{bad}'"):
            collective_timeout({"SPARSEFLOW_COLLECTIVE_TIMEOUT": bad})


def test_init_meets_every_rank_so_a_directory_cleared_before_it_is_not_cleared_after(
        tmp_path):
    """Rec SDK's programs clear their model directories on every rank, then call ``init()``
    and write there (as the Estimator's model_dir shared by the ranks): a rank that passed
    ``init()`` while another had not cleared yet lost what it wrote (a flaky 2-rank
    little_demo_estimator run under load). ``init()`` meets every rank, as HCCL's does."""
    shared = tmp_path / "shared"
    done = run_ranks(["tests.workers.init_rendezvous", str(shared)], 2)
    assert done.stdout.count("found rank0 rank1") == 2, done.stdout[-3000:]


def test_hccl_ops_and_graph_collectives_over_two_ranks(tmp_path):
    run_ranks(["tests.workers.hccl_ranks", str(tmp_path)], 2)
    values = [np.arange(6, dtype=np.float32).reshape(2, 3) * (r + 1) - r for r in range(2)]
    expected = {"sum": values[0] + values[1], "max": np.maximum(*values),
                "min": np.minimum(*values), "prod": values[0] * values[1],
                "gather": np.concatenate(values), "broadcast": values[1],
                "variable": values[0]}
    for shard in _shards(tmp_path, 2):
        for name, value in expected.items():
            np.testing.assert_allclose(shard[name], value, rtol=0, atol=1e-6, err_msg=name)


def test_restoring_from_another_number_of_ranks_names_a_missing_shard(tmp_path):
    from sparseflow.checkpoint import sparse_format as fmt
    from sparseflow.checkpoint.saver import read_rank_states

    shard = tmp_path / "sparse-model-0-6"
    shard.mkdir()
    fmt.write_manifest(str(shard), {}, None, {"rank": 0, "size": 2,
                                              "shards": ["sparse-model-0-6",
                                                         "sparse-model-1-6"]})
    with pytest.raises(fmt.CheckpointError, match=r"No sparse checkpoint at .*sparse-model-1-6"):
        read_rank_states(str(shard), None)


def test_a_rank_that_cannot_bind_its_address_fails_naming_it(tmp_path):
    """Rank 0's port is held by another listener: init() fails naming the rank, the
    address and why, before any training."""
    import socket

    thief = socket.socket()
    thief.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    thief.bind(("", 0))
    thief.listen()
    port = thief.getsockname()[1]
    code = ("import json, os, tensorflow as tf\n"
            "import sparseflow as sf\n"
            "tf.compat.v1.disable_eager_execution()\n"
            "sf.init()\n")
    tf_config = json.dumps({"cluster": {"worker": [f"localhost:{port}", "localhost:1"]},
                            "task": {"type": "worker", "index": 0}})
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3", TF_CONFIG=tf_config)
    try:
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=120)
    finally:
        thief.close()
    assert done.returncode != 0
    assert (f"AddressInUseError: rank 0 of 2 cannot listen on localhost:{port}, its address in "
            f"TF_CONFIG (cluster.worker[0]): port {port} is in use by another process"
            ) in done.stderr


def test_a_step_that_ends_the_data_does_not_break_the_next_collective_step():
    """Rec SDK's one-shot evaluation ends its data inside a step holding collectives, and
    one rank's step ends later than the other's. TensorFlow reuses a failed step's id for
    the next collective step; without a fresh collective graph key, the peer's cleanup of
    the failed step deleted the next step's buffers ("Delete called on non-empty
    BufRendezvous"), in the first rounds."""
    done = run_ranks(["tests.workers.end_of_data_ranks", "12"], 2)
    for rank in range(2):
        assert f"[rank {rank}] rank {rank}: 12 rounds" in done.stdout, done.stdout[-3000:]
