"""LoRA-B steering's analysis wing, above the steered runtime (topl_core/runtime: sites, vectors, hooks, modes, the
gate and the session):

    extract.py        build_steering_vectors: computing the vectors from an adapter; page_vectors: the Steering
                      page's and the service's
    slider.py         the Steering slider's engine (texts per λ, work ahead, the decode warmer); slider_texts.py: its
                      text store and neighbours; decode_warmer.py: its warmer; slider_ahead.py: a job of its work
                      ahead; slider_readers.py: its readers
    summary.py        site_table, export_bundle: what the Steering page shows of the vectors
    control_vector.py llama.cpp's control-vector GGUF; llama_cpp.py: the mode's control vector and the adapter's LoRA
    fluency.py        text_stats, perplexities: fluency of steered texts

Import the module you need: this package imports none of them.
"""
