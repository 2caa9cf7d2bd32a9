"""The C extensions (see README.md here): the per-message lane and its helpers."""
