"""Pure delivery logic: no I/O, no clock, no FastAPI, no store imports."""
