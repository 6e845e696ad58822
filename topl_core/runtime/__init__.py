"""The steered runtime: a merged model whose decoder sites are edited per λ, per mode and per batch row, with the
adapter's head as a judge — what the pages, the CLI, the studies and the service all generate through. It sits below
analysis/ and serve/ and above inference/ (the one decode loop), so the service imports nothing of the analysis wing.

Imports run one way, floor by floor (each module imports only from the floors above it in this list):

    sites       sites.py          LoRA sites: where an adapter's LoRA lives, its weights read from a run
    values      vectors.py        SteeringVectors: the value and its files (UNIT_FRACTION, normalised units)
                directions.py     the directions a mode acts along: LoRA-B's vector, the diff-mean and random controls
                steered_text.py   SteeredText, Replacement, GateCounts: a steered generation and what a judge replaced
    hooks       hooks.py          edit_outputs, SteeringSwitch: the generic hooks that apply site edits
    judges      gate.py           Head, HeadGate, GateJudge: the adapter's own head as a judge of the one decode loop
    actions     actions.py        SteeringAction (AddDirection, ScaleUpdate, AblateDirection), SteeringMode
    modes       modes.py          MODE_TABLE, MODES, steering_mode, SteerConfig, lambda_grids; steer (the public form)
    sessions    session.py        SteeringSession: a merged model kept for steering (λ grids, streams, compiled steps)

Import the module you need: this package imports none of them.
"""
