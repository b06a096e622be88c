"""STUB (owned by the verify-properties helper): check_<property>() -> PropertyResult."""
