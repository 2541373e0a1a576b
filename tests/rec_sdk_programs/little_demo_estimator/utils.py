"""The feature specs of the demo, and where input_fn leaves them for model_fn (input_fn builds
them in each Estimator graph; model_fn, called next in the same graph, looks them up)."""

from mx_rec.core.asc.helper import FeatureSpec


class FeatureSpecIns:
    """One holder per process of the latest training and evaluation spec lists."""

    _instance = None

    def __init__(self):
        self._specs = {"train": None, "eval": None}

    @classmethod
    def set_instance(cls):
        if cls._instance is not None:
            raise RuntimeError("FeatureSpecIns is set once")
        cls._instance = cls()

    @classmethod
    def get_instance(cls):
        if cls._instance is None:
            raise RuntimeError("call FeatureSpecIns.set_instance() first")
        return cls._instance

    def _get(self, kind):
        if self._specs[kind] is None:
            raise RuntimeError(f"no {kind} feature spec list yet: input_fn sets it")
        return self._specs[kind]

    def set_train_feature_spec_list(self, spec_list):
        self._specs["train"] = spec_list

    def get_train_feature_spec_list(self):
        return self._get("train")

    def set_eval_feature_spec_list(self, spec_list):
        self._specs["eval"] = spec_list

    def get_eval_feature_spec_list(self):
        return self._get("eval")


def create_feature_spec_list(cfg, use_timestamp=False, use_multi_lookup=False,
                             multi_lookup_times=2):
    """user_ids and item_ids specs (thresholds only with USE_TIMESTAMP), one more user_ids spec
    per extra lookup, and the timestamp spec last."""
    thresholds = dict(access_threshold=cfg.access_threshold if use_timestamp else None,
                      eviction_threshold=cfg.eviction_threshold if use_timestamp else None)
    spec_list = [FeatureSpec("user_ids", table_name="user_table", **thresholds),
                 FeatureSpec("item_ids", table_name="item_table", **thresholds)]
    if use_multi_lookup:
        spec_list.extend(FeatureSpec("user_ids", table_name="user_table", faae_coefficient=1,
                                     **thresholds) for _ in range(multi_lookup_times))
    if use_timestamp:
        spec_list.append(FeatureSpec("timestamp", is_timestamp=True))
    return spec_list
