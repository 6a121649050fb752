"""One episode: its prompt, the parsing of model turns, the state machine, the reward and its presets."""
