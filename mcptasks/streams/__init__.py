"""How task events travel: the SSE event store, cross-process signals, channel-layer membership, webhooks."""
