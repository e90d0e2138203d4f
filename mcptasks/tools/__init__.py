"""The tool-author API: the registry of tools, resources and prompts, and the context a tool receives."""
