"""Rec SDK ``mx_rec.util``.

``communication`` is imported here because Rec SDK scripts reach it as an attribute:
``import mx_rec.util as mxrec_util; mxrec_util.communication.hccl_ops.get_rank_id()``.
"""

from mx_rec.util import communication

__all__ = ["communication"]
