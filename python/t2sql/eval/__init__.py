"""`t2sql eval`: policies (oracle, OpenAI-compatible, sglang), their HTTP clients, the results file."""
