"""input_fn: the generated dataset, mapped through Rec SDK's key insertion in FeatureSpec mode
(the specs are built here, in the Estimator's graph), then prefetched."""

from mx_rec.core.asc.helper import get_asc_insert_func
from mx_rec.util.communication.hccl_ops import get_rank_size
from mx_rec.util.initialize import ConfigInitializer
from mx_rec.util.ops import import_host_pipeline_ops

from config import MULTI_LOOKUP_TIMES, USE_MODIFY_GRAPH, USE_MULTI_LOOKUP, USE_TIMESTAMP
from dataset import generate_dataset
from utils import FeatureSpecIns, create_feature_spec_list


def input_fn(params, cfg, is_eval=False, use_one_shot=False):
    seed = cfg.eval_seed if is_eval else cfg.train_seed
    dataset = generate_dataset(cfg, seed, use_timestamp=USE_TIMESTAMP,
                               batch_number=params.max_data_generate_steps * get_rank_size())

    if not USE_MODIFY_GRAPH:
        spec_list = create_feature_spec_list(cfg, USE_TIMESTAMP, USE_MULTI_LOOKUP,
                                             MULTI_LOOKUP_TIMES)
        if is_eval:
            FeatureSpecIns.get_instance().set_eval_feature_spec_list(spec_list)
            dataset = dataset.map(get_asc_insert_func(tgt_key_specs=spec_list, is_training=False))
            channel_id = ConfigInitializer.get_instance().train_params_config \
                .get_training_mode_channel_id(False)
            import_host_pipeline_ops().clear_channel(channel_id)
        else:
            FeatureSpecIns.get_instance().set_train_feature_spec_list(spec_list)
            dataset = dataset.map(get_asc_insert_func(tgt_key_specs=spec_list, is_training=True))

    dataset = dataset.prefetch(100)
    if not use_one_shot:
        return dataset

    iterator = dataset.make_one_shot_iterator()
    return iterator.get_next()
