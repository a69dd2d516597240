"""A run resumed: the newest checkpoint of a run that loads (`newest_checkpoint`), restored into
the run (`restore`), and the effects of stock callbacks that outlive a fit (`continuity`)."""
