"""TOPL Workbench core: data, models, training, analysis. Never imports streamlit."""

import warnings

# PEFT (0.21) calls transformers' deprecated `is_gradient_checkpointing` on every adapter load/injection; the warning
# is theirs to fix and only floods CLI output and job logs.
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
