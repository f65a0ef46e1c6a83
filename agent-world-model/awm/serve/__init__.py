"""Episodes over the network: the MCP server behind `awm env start`.

    mcp_server.py   MCP streamable HTTP in front of the runtime (`python -m awm.serve.mcp_server`)
    limits.py       the server's limits and token, shared with the CLI without importing the server
    corked_http.py  uvicorn's protocol with one write per reply
"""
