"""`canaryd bench`: the one-shot evaluation over a concurrency ladder (`run`) and what it
costs in memory and accelerator (`resources`)."""
