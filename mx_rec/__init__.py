"""``mx_rec``: Huawei Rec SDK's import paths, served by sparseflow.

Scripts written for Rec SDK keep their imports (``from mx_rec.core.embedding import
create_table``...). Importing ``mx_rec`` also does what Rec SDK's own import does to
TensorFlow: ``tf.compat.v1.train.Saver()`` saves and restores the sparse tables with the dense
variables (Rec SDK patches the Saver), ``tf.data.Dataset`` gains ``eos_map`` (and, on TF2
datasets, ``make_initializable_iterator`` / ``make_one_shot_iterator``),
``tf.compat.v1.layers.*`` work again on TF 2.21 (served by tf-keras's legacy layers), and a TF
optimizer's ``compute_gradients`` takes the sparse tables in ``var_list`` (Rec SDK's tables are
variables); Ascend-only session options (the ``NpuOptimizer`` custom graph optimizer) are dropped from
``tf.compat.v1.Session`` configs with one warning. NPU-only options without a CPU meaning are
accepted and named once in the ``mx_rec`` log at INFO; anything not supported that would
change results raises an error naming it. See docs/migrating-from-rec-sdk.md.
"""

from mx_rec import _compat

_compat.install()
