"""kembed.gateway.service: the flow every API shape shares, with no HTTP framework and no gRPC: a
request's way in (`request_gate`: the concurrency cap, deadline, class and its token admission,
`admission`), then tokenize, send to the worker pool and finish the rows (`service`).
"""
