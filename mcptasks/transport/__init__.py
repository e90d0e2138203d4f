"""The Streamable HTTP transport (a Channels consumer) and SSE framing."""
