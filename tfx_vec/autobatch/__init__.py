"""tfx_vec.autobatch (see README.md)."""
