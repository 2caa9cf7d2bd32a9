"""The device engine: requests, streams, the staging pool's users, the flight recorder,
tracing, diagnostics, the engine whole and the Python fast lane."""
