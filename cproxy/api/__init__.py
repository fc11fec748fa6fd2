"""The HTTP API: FastAPI routers that parse, call the broker and map errors."""
