"""Gates that read pairs: the same prompt run on both arms, scored (`gates.records.PairRecord`)."""
