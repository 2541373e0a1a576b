"""Rank detection from launcher environments."""

import json

import pytest
import tensorflow as tf

import sparseflow as sf
from sparseflow.distributed.ranks import Ranks, detect

LAUNCHERS = [
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_RANK=1"),
    ({"PMI_RANK": "2", "PMI_SIZE": "4"}, "PMI_RANK=2, PMI_SIZE=4"),
    ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "8"}, "HOROVOD_SIZE=8 (set by horovodrun)"),
    ({"RANK_ID": "5", "RANK_SIZE": "8"}, "RANK_ID=5, RANK_SIZE=8 (set by Rec SDK's rank table)"),
    ({"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:2", "c:3"]},
                               "task": {"type": "worker", "index": 2}})},
     "TF_CONFIG (worker 2, 3 training tasks)"),
]


@pytest.mark.parametrize("environ,source", LAUNCHERS, ids=["mpirun", "pmi", "horovod",
                                                           "rank_table", "tf_config"])
def test_each_launcher_is_read(environ, source):
    ranks = detect(environ)
    assert ranks.size > 1 and source in ranks.source


def test_one_process_and_the_reading_order():
    assert detect({}) == Ranks(0, 1)
    assert detect({"OMPI_COMM_WORLD_SIZE": "1"}).size == 1
    both = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1",
            "HOROVOD_RANK": "1", "HOROVOD_SIZE": "2"}
    assert detect(both).size == 1   # mpirun's variables are read first
    with pytest.raises(ValueError, match="PMI_SIZE must be an integer; received 'two'"):
        detect({"PMI_SIZE": "two"})
    with pytest.raises(ValueError, match=r"RANK_ID=4 and RANK_SIZE=4 .* must give a rank in "
                                         r"\[0, size\)"):
        detect({"RANK_ID": "4", "RANK_SIZE": "4"})


def test_init_over_several_ranks_without_addresses_names_what_it_found(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setenv("HOROVOD_RANK", "1")
    monkeypatch.setenv("HOROVOD_SIZE", "2")
    with pytest.raises(RuntimeError, match=r"rank 1 of 2 \(HOROVOD_RANK=1.*no TF_CONFIG gives "
                                           r"the ranks' addresses.*sparseflow launch -n 2"):
        sf.init()
    assert not sf.runtime.is_initialized()


def test_init_refuses_a_tf_config_that_disagrees_with_the_launcher(monkeypatch):
    monkeypatch.setenv("HOROVOD_RANK", "1")
    monkeypatch.setenv("HOROVOD_SIZE", "2")
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["localhost:1",
                                                                       "localhost:2"]},
                                                "task": {"type": "worker", "index": 0}}))
    with pytest.raises(RuntimeError, match=r"TF_CONFIG makes this process worker 0 of 2, but "
                                           r"HOROVOD_RANK=1.* says rank 1 of 2"):
        sf.init()
    assert not sf.runtime.is_initialized()


def test_the_tf2_face_over_several_ranks_needs_multi_worker_mirrored_strategy(monkeypatch):
    monkeypatch.setenv("HOROVOD_RANK", "1")
    monkeypatch.setenv("HOROVOD_SIZE", "2")
    from sparseflow import tf2
    with pytest.raises(RuntimeError, match=r"sparseflow.tf2.Embedding: this process is rank 1 "
                                           r"of 2 \(HOROVOD_RANK=1.*MultiWorkerMirroredStrategy"
                                           r".*Found _DefaultDistributionStrategy with 1 "
                                           r"replica"):
        tf2.Embedding({"f": tf2.FeatureConfig(tf2.TableConfig(10, 4, name="t"))},
                      tf2.SGD(0.1))


def test_tf_config_counts_training_tasks_and_a_lone_chief_is_one_process():
    lone_chief = json.dumps({"cluster": {"chief": ["a:1"]}, "task": {"type": "chief",
                                                                    "index": 0}})
    assert detect({"TF_CONFIG": lone_chief}).size == 1
    chief_and_worker = {"cluster": {"chief": ["a:1"], "worker": ["b:2"], "ps": ["c:3"]},
                        "task": {"type": "worker", "index": 0}}
    assert detect({"TF_CONFIG": json.dumps(chief_and_worker)}) == Ranks(
        1, 2, "TF_CONFIG (worker 0, 2 training tasks)")
    chief_and_worker["task"] = {"type": "ps", "index": 0}
    assert detect({"TF_CONFIG": json.dumps(chief_and_worker)}).size == 1
    assert detect({"OMPI_COMM_WORLD_SIZE": "", "TF_CONFIG": ""}) == Ranks(0, 1)
    with pytest.raises(ValueError, match="TF_CONFIG must be JSON like"):
        detect({"TF_CONFIG": "{not json"})
