"""The pure MCP protocol layer: JSON-RPC 2.0 and MCP 2025-11-25 messages.

Nothing in this package imports Django or performs I/O, so it is unit-tested without a
database and can be reused by any transport.
"""
