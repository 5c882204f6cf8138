"""kembed.worker.tools: the worker's command-line tools that serve no traffic: the operator Jobs' admin
client (`admin`: stats, prewarm, smoke), `check-model` (`check_model`) and `fetch-model` (the command
`fetch_command`, the fetch `model_fetch`) with its sources (`fetch_source`, `fetch_hub`, `fetch_s3`).
"""
