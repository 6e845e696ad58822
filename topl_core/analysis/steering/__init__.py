"""LoRA-B steering: editing a merged model's site outputs along the adapter's directions, under a λ slider.

Imports run one way, floor by floor (each module imports only from the floors above it in this list):

    values      vectors.py        SteeringVectors: the value and its files (UNIT_FRACTION, normalised units)
                directions.py     the directions a mode acts along: LoRA-B's vector, the diff-mean and random controls
                steered_text.py   SteeredText, Replacement, GateCounts: a steered generation and what a judge replaced
                control_vector.py llama.cpp's control-vector GGUF
    hooks       hooks.py          edit_outputs, SteeringSwitch: the generic hooks that apply site edits
    judges      gate.py           Head, HeadGate, GateJudge: the adapter's own head as a judge of the one decode loop
    actions     actions.py        SteeringAction (AddDirection, ScaleUpdate, AblateDirection), SteeringMode
    modes       modes.py          MODE_TABLE, MODES, steering_mode, SteerConfig, lambda_grids; steer (the public form)
    sessions    session.py        SteeringSession: a merged model kept for steering (λ grids, streams, compiled steps)
                slider.py         the Steering slider's engine (texts per λ, work ahead, the decode warmer);
                                  slider_texts.py: its text store and neighbours; decode_warmer.py: its warmer;
                                  slider_ahead.py: a job of its work ahead; slider_readers.py: its readers
    around      extract.py        build_steering_vectors: computing the vectors from an adapter
                summary.py        site_table, export_bundle: what the Steering page shows of the vectors
                llama_cpp.py      the mode's control vector and the adapter's LoRA for llama.cpp
                fluency.py        text_stats, perplexities: fluency of steered texts

Import the module you need: this package imports none of them.
"""
