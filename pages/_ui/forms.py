"""Form inputs shared by the config forms (Train, Layer sweep)."""

from __future__ import annotations

from topl_core.precision import PRECISIONS, describe_precision, resolve_precision


def precision_select(container, key: str, device: str) -> str:
    """The compute-precision picker of the forms (Train, Layer sweep): "auto" shows what it resolves to here."""
    return container.selectbox(
        "Precision", PRECISIONS, key=key, persist_state="session",
        format_func=lambda p: f"auto → {resolve_precision('auto', device)}" if p == "auto" else p,
        help=f"auto = bf16 autocast only where this machine computes bf16 natively and fast; here: "
             f"{describe_precision('auto', device)}. bf16 on a CPU without it (AVX2 only) runs far slower than fp32.")
