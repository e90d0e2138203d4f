"""mcptasks: MCP tools behind one Streamable HTTP endpoint, run as durable tenant-scoped MCP Tasks."""
