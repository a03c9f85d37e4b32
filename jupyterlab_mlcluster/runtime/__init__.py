"""Code that runs inside each rank (the floor of the layers: it imports nothing of the engine):
the worker, the user code's run, the payload, the signed reports to the supervisor, a
session's rank and its channel, `mlc.log`, samplers, stack dumps and pdb."""
