"""The MCP endpoint over HTTP: the gate, one admission pipeline for both eras, the thin consumer, SSE."""
