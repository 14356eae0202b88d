"""The contract version stamped on every lake file and every MLflow model.

Bump the major part when a column is removed, renamed or changes meaning (readers must refuse
the old files); bump the minor part when a nullable column is added (old files stay readable).
"""

from __future__ import annotations

CONTRACT_VERSION = "1.0"
