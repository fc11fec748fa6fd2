"""Drives the pure engine with a store: the broker and its per-group runners."""
