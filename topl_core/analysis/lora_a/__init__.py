"""LoRA-A as a classifier: sites, capture of A-projections, separability (AUROC per layer × module), the cached
probe pipeline, probe heads for adapters without one, UMAP of projections."""
