"""Tenants, their principals, limits and authentication of MCP requests."""
