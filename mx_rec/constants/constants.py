"""Rec SDK ``mx_rec.constants.constants``: graph collection names, channel ids, the names of
Rec SDK's op libraries, and the enums its scripts use.

Collections sparseflow fills: ``ASCEND_GLOBAL_HASHTABLE_COLLECTION`` (the tables),
``ASCEND_TIMESTAMP`` (read by graph modification), and under dynamic expansion
``ASCEND_SPARSE_LOOKUP_LOCAL_EMB``, ``ASCEND_SPARSE_LOOKUP_ID_OFFSET`` and
``ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS``. The other ``ASCEND_SPARSE_LOOKUP_*`` names exist so that
scripts importing them run; sparseflow's lookup has no such intermediate tensors and leaves
those collections empty.
"""

from enum import Enum

ASCEND_GLOBAL_HASHTABLE_COLLECTION = "ASCEND_GLOBAL_HASHTABLE_COLLECTION"
ASCEND_TIMESTAMP = "ASCEND_TIMESTAMP"
ASCEND_CUTTING_POINT_INITIALIZER = "ASCEND_CUTTING_POINT_INITIALIZER"
ASCEND_SPARSE_LOOKUP_ENTRANCE = "ASCEND_SPARSE_LOOKUP_ENTRANCE"
ASCEND_SPARSE_LOOKUP_LOCAL_EMB = "ASCEND_SPARSE_LOOKUP_LOCAL_EMB"
ASCEND_SPARSE_LOOKUP_ID_OFFSET = "ASCEND_SPARSE_LOOKUP_ID_OFFSET"
ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS = "ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS"
ASCEND_SPARSE_LOOKUP_RESTORE_VECTOR = "ASCEND_SPARSE_LOOKUP_RESTORE_VECTOR"
ASCEND_SPARSE_LOOKUP_LOOKUP_RESULT = "ASCEND_SPARSE_LOOKUP_LOOKUP_RESULT"
ASCEND_SPARSE_LOOKUP_ALL2ALL_MATRIX = "ASCEND_SPARSE_LOOKUP_ALL2ALL_MATRIX"
ASCEND_SPARSE_LOOKUP_HOT_POS = "ASCEND_SPARSE_LOOKUP_HOT_POS"

# The data channels of Rec SDK's host pipeline: training batches and evaluation batches.
TRAIN_CHANNEL_ID = 0
EVAL_CHANNEL_ID = 1

# Rec SDK's op libraries, passed to import_host_pipeline_ops(so_path); sparseflow has nothing
# to load (its host pipeline runs inside tf.data), so only the names matter.
LIBASC_OPS_SO = "libasc_ops.so"
LIBREC_EOS_OPS_SO = "librec_eos_ops.so"
LIBREC_TF_REC_V1_CPU_SO = "librec_tf_rec_v1_cpu.so"
# Environment variables through which Rec SDK finds those libraries (not read by sparseflow).
CUSTOMIZED_OPS_LIB_PATH = "CUSTOMIZED_OPS_LIB_PATH"
HOST_PIPELINE_OPS_LIB_PATH = "HOST_PIPELINE_OPS_LIB_PATH"


class BaseEnum(Enum):
    """An Enum whose members can be looked up by value, as Rec SDK scripts do with
    ``UseMode.mapping(os.getenv("USE_MODE"))``."""

    @classmethod
    def mapping(cls, key):
        """The member whose value is ``key`` (or ``key.value`` when ``key`` is a member).

        Raises:
          KeyError: no member has that value; the message lists the allowed values.
        """
        value = key.value if isinstance(key, BaseEnum) else key
        for member in cls:
            if member.value == value:
                return member
        allowed = ", ".join(repr(member.value) for member in cls)
        raise KeyError(f"Argument `key` of {cls.__name__}.mapping must be one of {allowed}. "
                       f"Received: {key!r}")


class ApplyGradientsStrategy(BaseEnum):
    """How dynamic-expansion scripts pick the addresses their by-address optimizer applies
    gradients to: ``ASCEND_SPARSE_LOOKUP_ID_OFFSET`` (direct) or
    ``ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS`` (sum the gradients of one key first)."""

    DIRECT_APPLY = "direct_apply"
    SUM_SAME_ID_GRADIENTS_AND_APPLY = "sum_same_id_gradients_and_apply"


class CacheModeEnum(BaseEnum):
    """Where a table's rows live in Rec SDK: device memory only, device over host memory, or
    device over host over disk."""

    HBM = "HBM"
    DDR = "DDR"
    SSD = "SSD"


class MxRecMode(BaseEnum):
    """Rec SDK's run mode: only ``ASC`` (sparse tables with a host-side key pipeline)."""

    ASC = "ASC"


class All2allGradientsOp(BaseEnum):
    """``create_table(all2all_gradients_op=...)``: how gradients from several ranks combine."""

    SUM_GRADIENTS = "sum_gradients"
    SUM_GRADIENTS_AND_DIV_BY_RANKSIZE = "sum_gradients_and_div_by_ranksize"
