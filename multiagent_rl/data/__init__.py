"""Data: where played episodes go and come back from — the episode logs
([`sinks`][multiagent_rl.data.sinks]), Parquet trace datasets ([`traces`][multiagent_rl.data.traces]) and the
Hugging Face Hub ([`hub`][multiagent_rl.data.hub])."""
