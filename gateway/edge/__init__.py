"""kembed.gateway.edge: the HTTP edge: uvicorn's processes (`processes`), the connections' bounds and the
hot routes served past ASGI (`connections`, `hot_path`), the Starlette app and its route table (`app`),
the API key (`auth`) and a leaving client's cancel (`disconnect`).

It wires routes to handlers and errors to responses; what a request means is the `api` below it.
"""
