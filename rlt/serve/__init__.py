"""`rlt serve`: an OpenAI-compatible HTTP server over rlt.Engine (FastAPI + uvicorn)."""
