"""arborl.synth."""
