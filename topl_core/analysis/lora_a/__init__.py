"""LoRA-A as a classifier: does the adapter's A matrix separate good from bad tokens, site by site.

    sites.py         Site, lora_sites, LoraWeights, read_lora_weights: the LoRA sites of an adapter
    capture.py       capture_lora, collect_projections, Projections: each site's input projected on A
    separability.py  separability, comparison_table, Separability: cross-validated AUROC per layer × module
    probe.py         probe_run, ProbeSettings, ProbeResult, labelled_split: the cached probe pipeline
    probe_head.py    fit_probe_head, ProbeHead: a probe head for an adapter without one
    umap_view.py     run_umap: UMAP of the projections

Import the module you need: this package imports none of them.
"""
