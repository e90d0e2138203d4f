"""Shared test helpers: real server processes, an MCP HTTP client, schema validation."""
