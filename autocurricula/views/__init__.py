"""What a run shows: callbacks, plots, transcripts and experiment trackers."""
