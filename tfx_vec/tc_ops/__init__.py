"""tfx_vec.tc_ops (see README.md)."""
