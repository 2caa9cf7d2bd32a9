"""The C extension (see README.md here): the per-message lane, ``_lane``."""
