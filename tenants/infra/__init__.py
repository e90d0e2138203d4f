"""Generic helpers with no MCP or tenant knowledge, importable by both apps.

Typed settings, coalescing of concurrent calls, Redis URLs (``redis_url``), the pools built from
them (``redis_pools``) and the Sentinel discovery those pools use (``redis_sentinel``).
"""
