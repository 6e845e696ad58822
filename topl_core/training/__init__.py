"""Training: the config, the methods, the one training loop, and what a run leaves behind.

    config.py       TrainConfig, LoraSettings, preset_config (validated against the method registry), tiny_topl_config
    methods/        one module per training method, registered in METHODS
    trainer.py      train: the one training loop (run_inputs.py, steps.py, batching.py, lora.py, checkpoint.py,
                    clock.py, flops.py, memory.py, prefix_cache.py, tracking.py, world.py are its parts)
    run_dirs.py     RunDir: a run's directory, its files and loading them back
    adapters.py     open_adapter, Adapter, load_adapter: any adapter (a run, a PEFT folder, a hub id) onto a base
    card.py         a finished run's model card (write_card)
    sharing.py      a run exported for sharing and pushed to a hub (export_run, push_to_hub)

Import the module you need: this package imports none of them.
"""
