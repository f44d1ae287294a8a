# A stand-in for verl (which cannot be installed here): only verl.checkpoint_engine.base, with the
# interface of verl >= 0.9 that a checkpoint-engine backend sees.
