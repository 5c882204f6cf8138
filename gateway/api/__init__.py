"""kembed.gateway.api: the routes by API (OpenAI, TEI, Cohere, Perplexity, several outputs a text), their
request models parsed from bytes (`schemas`), the one JSON response (`responses`) and the OpenAPI
document built from what is served (`openapi`, `openapi_limits`).

Handlers turn a request body into a call of the service and its answer into the API's shape; they
hold no tokenizer, queue or worker of their own.
"""
