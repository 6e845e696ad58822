"""LoRA-B steering: editing a merged model's site outputs along the adapter's directions, under a λ slider.

    actions.py         SteeringAction (AddDirection, ScaleUpdate, AblateDirection), SteeringMode, Decoding
    gate.py            GateOnHead, gated_decode, Head: steering gated token by token by the adapter's own head
    steered_text.py    SteeredText, Replacement, GateCounts: a steered generation and what a gate replaced
    modes.py           MODE_TABLE, MODES, steering_mode, SteerConfig, lambda_grids: the mode registry
    vectors.py         SteeringVectors: the value and its files
    extract.py         build_steering_vectors: computing them from an adapter
    hooks.py           steer: the context manager whose hooks apply an action
    session.py         SteeringSession: a merged model kept for steering (λ grids, stream_steered, grid_generations)
    summary.py         site_table, export_bundle: what the Steering page shows of the vectors
    control_vector.py  llama.cpp control-vector GGUF; llama_cpp.py: the adapter's LoRA for llama.cpp beside it
    fluency.py         text_stats, perplexities: fluency of steered texts

Import the module you need: this package imports none of them.
"""
