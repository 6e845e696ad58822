"""LoRA-A capture: the r-dim projection A·x of every site's input x, for chosen tokens, in one forward pass.

    with capture_lora(model, sites=None, weights=None, controls=None, keep_inputs=()) as cap:
        cap.run(input_ids, attention_mask, select)          # select: (B, T) bool — which tokens to keep
    cap.result(labels=..., record_ids=..., ...) -> Projections   (or cap.result(..., name="random") for a control)

    collect_projections(model, tokenizer, records, select="labelled", batch_size=4, max_doc_tokens=320,
                        max_response_tokens=128, precision="fp32", sites=None, weights=None, controls=None,
                        keep_inputs=()) -> Projections | dict[str, Projections]

How x is taken. A forward pre-hook on the LoRA layer's `base_layer` (or on the plain Linear of a merged model)
records the layer input x, and the hook projects it with A: proj = x @ Aᵀ in float32 (autocast off: under bf16 the
forward itself runs in bf16, the projection does not). The base layer runs whether the adapter is active, disabled
(`with model.disable_adapter()`) or merged, so capture works in all three; LoRA's dropout (which acts only on the
LoRA branch) never touches x, and the model is put in eval mode for the capture (its previous mode is restored).
A is PEFT's `lora_A[adapter].weight` unless `weights` gives A per site (for a merged model: `read_lora_weights(run)`).
`controls` adds further named projection sets computed on the very same x (e.g. a random-init A: `random_lora_A`).

The forward stops right after the last site's decoder layer (an early exit; later layers and the LM head never
run). Hooks are registered inside `try` and removed in `finally`, on every exit path.
"""

from __future__ import annotations

import json
import math
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Literal, Mapping, Sequence

import numpy as np
import torch

from ...data.encode import IGNORE, Encoded, collate, encode_record
from ...data.records import Record
from ...hardware.precision import autocast, full_precision, to_numpy
from ...models.forward import hidden_after_layer
from ...runtime.sites import Site, input_module, lora_sites, lora_weights, sort_sites

Select = Literal["labelled", "response"]
DEFAULT_SET = "lora"


@dataclass(frozen=True)
class Projections:
    """Captured A·x for n tokens. `values[site.key]` is (n, r) float32; row i of every array is token i.

    `labels` 1 good / 0 bad / -1 unlabelled; `record_ids`, `positions` (index of the token within its response)
    and `tokens` (its text) identify each row; `doc_ids` its document (None: unknown). `inputs[site.key]` holds
    the raw x (n, d_in) for sites that were asked for with keep_inputs (UMAP of hidden states)."""

    sites: tuple[Site, ...]
    values: dict[str, np.ndarray]
    labels: np.ndarray
    record_ids: np.ndarray
    positions: np.ndarray
    tokens: np.ndarray
    doc_ids: np.ndarray | None = None  # (n,) document of each token (cross-validation folds group by document)
    inputs: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def n_tokens(self) -> int:
        return int(len(self.labels))

    @property
    def r(self) -> int:
        return int(next(iter(self.values.values())).shape[1]) if self.values else 0

    def __getitem__(self, site: Site | str) -> np.ndarray:
        return self.values[site.key if isinstance(site, Site) else site]

    def site(self, key: str) -> Site:
        for s in self.sites:
            if s.key == key:
                return s
        raise KeyError(f"no site {key!r}; sites are {[s.key for s in self.sites][:8]} …")

    def subset(self, rows: np.ndarray) -> "Projections":
        """The same projections for a subset of tokens (boolean mask or index array)."""
        return Projections(
            self.sites,
            {k: v[rows] for k, v in self.values.items()},
            self.labels[rows],
            self.record_ids[rows],
            self.positions[rows],
            self.tokens[rows],
            None if self.doc_ids is None else self.doc_ids[rows],
            {k: v[rows] for k, v in self.inputs.items()},
        )

    def labelled(self) -> "Projections":
        return self.subset(self.labels != IGNORE)

    # --- npz codec (no pickle: strings are fixed-width unicode arrays) ---------------------------------------
    def to_arrays(self) -> dict[str, np.ndarray]:

        out = {
            "meta/sites": np.asarray(json.dumps([s.to_json() for s in self.sites])),
            "labels": self.labels,
            "record_ids": self.record_ids.astype(str),
            "positions": self.positions,
            "tokens": self.tokens.astype(str),
        }
        if self.doc_ids is not None:
            out["doc_ids"] = self.doc_ids.astype(str)
        out.update({f"values/{k}": v for k, v in self.values.items()})
        out.update({f"inputs/{k}": v for k, v in self.inputs.items()})
        return out

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> "Projections":

        sites = tuple(Site.from_json(d) for d in json.loads(str(arrays["meta/sites"])))
        values = {s.key: np.asarray(arrays[f"values/{s.key}"]) for s in sites}
        inputs = {k[len("inputs/") :]: np.asarray(v) for k, v in arrays.items() if k.startswith("inputs/")}
        return cls(
            sites,
            values,
            np.asarray(arrays["labels"]),
            np.asarray(arrays["record_ids"]),
            np.asarray(arrays["positions"]),
            np.asarray(arrays["tokens"]),
            np.asarray(arrays["doc_ids"]) if "doc_ids" in arrays else None,
            inputs,
        )


class Capture:
    """What `capture_lora` yields: call `run` once per batch inside the context, then `result`."""

    def __init__(
        self,
        model: torch.nn.Module,
        sites: Sequence[Site],
        sets: dict[str, dict[Site, torch.Tensor]],
        keep_inputs: Sequence[str],
    ):
        self.model = model
        self.sites = tuple(sites)
        self.sets = sets
        self.keep_inputs = set(keep_inputs)
        self.last_layer = max(s.layer for s in self.sites)
        self._rows: torch.Tensor | None = None  # indices of the kept tokens in the flattened (B·T) batch
        self._thread: int | None = None  # only forwards from the thread inside run() are captured
        self._chunks: dict[str, dict[str, list[np.ndarray]]] = {name: {s.key: [] for s in self.sites} for name in sets}
        self._inputs: dict[str, list[np.ndarray]] = {k: [] for k in self.keep_inputs}
        # this batch's projections, kept on the model's device until the forward ends: one transfer per batch
        self._pending: list[tuple[str, str, torch.Tensor]] = []
        self._n = 0

    def _hook(self, site: Site):
        mats = {name: w[site] for name, w in self.sets.items()}

        def pre_hook(_module, args):
            if self._rows is None or threading.get_ident() != self._thread:
                return None
            x = args[0].flatten(0, -2).index_select(0, self._rows).float()  # (n, d_in): kept tokens, row-major
            with full_precision(x.device.type):  # under bf16 autocast the forward runs in bf16, A·x in float32
                for name, A in mats.items():
                    self._pending.append((name, site.key, x @ A.T))
            if site.key in self.keep_inputs:
                self._inputs[site.key].append(to_numpy(x))
            return None

        return pre_hook

    @torch.no_grad()
    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, select: torch.Tensor) -> int:
        """One forward pass (stopping after the last site's layer); keeps the tokens where `select` is True.
        Returns the number of tokens kept. The kept rows are found on the host (select is given there) and every
        site's projection stays on the device until the pass ends, so a GPU never waits inside the forward."""
        rows = select.reshape(-1).bool().cpu().nonzero().squeeze(1)
        self._rows = rows.to(input_ids.device)
        self._thread = threading.get_ident()
        try:
            hidden_after_layer(self.model, input_ids, attention_mask, self.last_layer)
            if self._pending:  # every site's (n, r) in one transfer, then split
                joined = to_numpy(torch.cat([p for _, _, p in self._pending], dim=1))
                widths = np.cumsum([p.shape[1] for _, _, p in self._pending])[:-1]
                for (name, key, _), part in zip(self._pending, np.split(joined, widths, axis=1)):
                    self._chunks[name][key].append(part)
        finally:
            self._rows = self._thread = None
            self._pending = []
        self._n += len(rows)
        return len(rows)

    def result(
        self,
        labels: np.ndarray,
        record_ids: Sequence[str],
        positions: np.ndarray,
        tokens: Sequence[str],
        name: str = DEFAULT_SET,
        doc_ids: Sequence[str] | None = None,
    ) -> Projections:
        """The captured projections of set `name` ("lora", or a control's name), with per-token metadata
        (one entry per kept token, in the order the tokens were kept: batch by batch, row-major)."""
        if len(labels) != self._n:
            raise ValueError(f"result: {len(labels)} labels for {self._n} captured tokens; pass one per kept token.")
        r_of = {s.key: int(self.sets[name][s].shape[0]) for s in self.sites}
        values = {
            k: (np.concatenate(c).astype(np.float32) if c else np.zeros((0, r_of[k]), np.float32))
            for k, c in self._chunks[name].items()
        }
        inputs = {k: np.concatenate(c).astype(np.float32) for k, c in self._inputs.items() if c}
        return Projections(
            self.sites,
            values,
            np.asarray(labels, dtype=np.int8),
            np.asarray(record_ids, dtype=str),
            np.asarray(positions, dtype=np.int32),
            np.asarray(tokens, dtype=str),
            None if doc_ids is None else np.asarray(doc_ids, dtype=str),
            inputs,
        )


@contextmanager
def capture_lora(
    model: torch.nn.Module,
    sites: Sequence[Site] | None = None,
    weights: Mapping[Site, torch.Tensor] | None = None,
    controls: Mapping[str, Mapping[Site, torch.Tensor]] | None = None,
    keep_inputs: Sequence[str] = (),
    adapter: str | None = None,
) -> Iterator[Capture]:
    """Hooks that record A·x at every site while active (see the module docstring). `sites` defaults to every
    LoRA site of a PEFT model; `weights` maps a site to its A (r, d_in) (default: PEFT's lora_A); `controls`
    maps a name to further A matrices per site; `keep_inputs` lists site keys whose raw x is kept too."""
    if sites is None:
        sites = lora_sites(model) if weights is None else sort_sites(weights)
    sites = sort_sites(sites)
    if not sites:
        raise ValueError("capture_lora: no sites to capture.")
    if weights is None:
        weights = {s: lora_weights(model, s, adapter).A for s in sites}
    device = next(model.parameters()).device
    sets = {DEFAULT_SET: {s: weights[s].detach().float().to(device) for s in sites}}
    for name, mats in (controls or {}).items():
        sets[name] = {s: mats[s].detach().float().to(device) for s in sites}
    cap = Capture(model, sites, sets, keep_inputs)
    was_training = model.training
    handles = []
    try:
        model.eval()
        for s in sites:
            handles.append(input_module(model, s).register_forward_pre_hook(cap._hook(s)))
        yield cap
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)


def random_lora_A(
    sites: Sequence[Site], r_of: Mapping[Site, int] | int, d_in_of: Mapping[Site, int], seed: int = 0
) -> dict[Site, torch.Tensor]:
    """Random A matrices drawn like PEFT's initialisation (kaiming-uniform, a=√5: U(−1/√d_in, 1/√d_in)), seeded,
    one (r, d_in) per site: the random-init-A control of docs/design.md §3."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for s in sort_sites(sites):
        r = r_of if isinstance(r_of, int) else r_of[s]
        bound = 1.0 / math.sqrt(d_in_of[s])
        out[s] = (torch.rand((r, d_in_of[s]), generator=g) * 2 - 1) * bound
    return out


_LIBC = None


def trim_heap() -> None:
    """Hand freed heap pages back to the OS (glibc malloc_trim; a no-op elsewhere). Batches of varying sequence
    length fragment glibc's heap: without this, resident memory of a SmolLM2 capture grew with every batch
    (docs/performance.md, "Figures behind the code's choices")."""
    global _LIBC
    if _LIBC is None:
        try:
            import ctypes

            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)


def _token_rows(e: Encoded, select: Select) -> tuple[np.ndarray, np.ndarray]:
    """Sequence positions to keep for one example and their index within the response."""
    idx = np.arange(e.response_start, e.response_end)
    if select == "labelled":
        idx = idx[e.labels[idx] != IGNORE]
    elif select != "response":
        raise ValueError(f"select={select!r}: choose 'labelled' (response tokens with a label) or 'response'.")
    return idx, idx - e.response_start


def collect_projections(
    model: torch.nn.Module,
    tokenizer,
    records: Sequence[Record],
    select: Select = "labelled",
    batch_size: int = 4,
    max_doc_tokens: int | None = 320,
    max_response_tokens: int = 128,
    precision: Literal["fp32", "bf16"] = "fp32",
    sites: Sequence[Site] | None = None,
    weights: Mapping[Site, torch.Tensor] | None = None,
    controls: Mapping[str, Mapping[Site, torch.Tensor]] | None = None,
    keep_inputs: Sequence[str] = (),
    progress=None,
) -> Projections | dict[str, Projections]:
    """Encode records, run them in length-sorted batches through `capture_lora`, and return the Projections of
    the chosen tokens (labelled response tokens by default). With `controls`, returns {"lora": …, name: …}.
    `progress(done, total)` is called after each batch."""

    encoded = [encode_record(tokenizer, r, max_doc_tokens, max_response_tokens) for r in records]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    device = next(model.parameters()).device
    labels, rids, docs, positions, tokens = [], [], [], [], []
    with capture_lora(model, sites, weights, controls, keep_inputs) as cap:
        for k in range(0, len(order), batch_size):
            chunk = order[k : k + batch_size]
            batch = collate([encoded[i] for i in chunk], tokenizer.pad_token_id)
            keep = torch.zeros_like(batch.attention_mask, dtype=torch.bool)
            for row, i in enumerate(chunk):
                e, rec = encoded[i], records[i]
                seq_idx, resp_idx = _token_rows(e, select)
                keep[row, torch.from_numpy(seq_idx)] = True
                labels.append(e.labels[seq_idx])
                rids.extend([rec.id] * len(seq_idx))
                docs.extend([rec.doc_id] * len(seq_idx))
                positions.append(resp_idx)
                tokens.extend(rec.response[a:b] for a, b in e.response_offsets[resp_idx])
            with autocast(precision, device.type):
                cap.run(batch.input_ids.to(device), batch.attention_mask.to(device), keep)
            trim_heap()
            if progress is not None:
                progress(min(k + batch_size, len(order)), len(order))
        lab = np.concatenate(labels) if labels else np.zeros(0, np.int8)
        pos = np.concatenate(positions) if positions else np.zeros(0, np.int32)
        names = [DEFAULT_SET, *(controls or {})]
        results = {n: cap.result(lab, rids, pos, tokens, name=n, doc_ids=docs) for n in names}
    return results if controls else results[DEFAULT_SET]
