"""rlt workers as an NVIDIA Dynamo backend (`python -m rlt.dynamo`; the `rlt[dynamo]` extra)."""
