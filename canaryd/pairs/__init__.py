"""Pairs: the prompt suites (`suites`), which prompt comes next (`sampler`), one prompt on
the baseline and every speculative arm (`runner`), and how a run is planned from the
settings — suites, sampler, engines, runner and the run record — for the daemon and every
command alike (`plan`)."""
