"""What the coordinator (rlt/control) and the workers (rlt/workers) agree on, so that neither
imports the other: the options they run with (config.py, typed by fields.py), a request's sampling
parameters and how they are resolved against the model (sampling_params.py, validation.py), its
grammar (grammar.py), the messages between the processes (protocol.py) and the prefix-cache keys
(prefix_keys.py)."""
