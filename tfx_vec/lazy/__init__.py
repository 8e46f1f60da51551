"""tfx_vec.lazy (see README.md)."""
