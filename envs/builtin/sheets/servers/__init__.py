"""MCP servers of the spreadsheet environment."""
