"""Limits on an embedding table's configuration: one home for every face that configures one.

Rec SDK's ``create_table`` (:mod:`sparseflow.embed.table_config`), the TF2 ``TableConfig``
(:mod:`sparseflow.tf2.config`), the YAML job schema (:mod:`sparseflow.jobs.schema`),
``FeatureSpec`` and the tables that ``sparseflow stats --suggest`` proposes
(:mod:`sparseflow.stats.suggest`) all import these, so a table one of them accepts is
accepted by the others. Each face words its own message (argument, value, allowed range).

No TensorFlow here: the stats job and the YAML validator import it.
"""

from __future__ import annotations

import re

from sparseflow.validation import INT32_MAX

# Rec SDK's documented ranges (create_table, FeatureSpec), kept by every face.
MAX_DIM = 8192
# Rows per tier (device, host, SSD); also the TF2 and YAML `vocabulary_size`.
MAX_VOCABULARY_SIZE = 10**9

# A table's name names files and checkpoint keys: a short run of portable characters.
TABLE_NAME_MAX_LEN = 100
TABLE_NAME_CHARS = "A-Za-z0-9_."   # a regex character class's body
TABLE_NAME_PATTERN = re.compile(f"[{TABLE_NAME_CHARS}]{{1,{TABLE_NAME_MAX_LEN}}}")

# A feature's name (FeatureSpec's `name` and `table_name`, a YAML job's feature key).
FEATURE_NAME_MAX_LEN = 255

# Admission: a key gets a row once counted this many times; -1 turns admission off.
ACCESS_THRESHOLD_MIN = -1
ACCESS_THRESHOLD_MAX = INT32_MAX
# Eviction: keys unseen for this many timestamp units leave the table; "off" is -1
# (FeatureSpec, YAML) or None (TF2).
EVICTION_THRESHOLD_MAX = INT32_MAX
