"""Records → token ids with per-token labels, for any tokenizer.

The prompt uses the model's chat template when it has one (else a plain "Document/Summary" prompt with BOS).
Character spans map to tokens through offsets. Offsets of byte-level tokenizers include the leading space, so a
token is bad only if a non-space character it covers lies in a bad span.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from ..foundations.errors import DataError
from ..foundations.presets import LANGUAGES, language_pair
from .records import Record

IGNORE = -1  # label of tokens that are not supervised (prompt, document, end-of-turn)

INSTRUCTIONS = {
    "summarization": "Summarize the following document.",
    "translation": "Translate the following sentence.",
}


@dataclass(frozen=True)
class Encoded:
    """One tokenized example. `labels[i]` is 1 good / 0 bad / -1 unsupervised for every position;
    response tokens are positions [response_start, response_end)."""

    input_ids: np.ndarray
    labels: np.ndarray
    response_start: int
    response_end: int
    response_offsets: np.ndarray  # (n_response_tokens, 2) character offsets into record.response
    record_id: str
    sequence_label: int

    @property
    def response_labels(self) -> np.ndarray:
        return self.labels[self.response_start : self.response_end]

    def __len__(self) -> int:
        return len(self.input_ids)


def instruction(task: str, lang_pair: str | None = None) -> str:
    """The task's instruction; a translation whose pair is known names both languages ("Translate the following
    English sentence into German.")."""
    if task == "translation" and lang_pair:
        source, target = (LANGUAGES.get(code, code) for code in language_pair(lang_pair))
        return f"Translate the following {source} sentence into {target}."
    return INSTRUCTIONS[task]


def user_message(document: str, task: str = "summarization", lang_pair: str | None = None) -> str:
    """What the user says in the prompt: the task's instruction and the document (a chat's user message)."""
    return f"{instruction(task, lang_pair)}\n\n{'Document' if task == 'summarization' else 'Sentence'}:\n{document}"


def build_prompt(tokenizer, document: str, task: str = "summarization", lang_pair: str | None = None) -> str:
    """The text before the response: chat template with a generation prompt, or a plain prompt."""
    user = user_message(document, task, lang_pair)
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True
        )
    bos = tokenizer.bos_token or ""
    answer = "Summary" if task == "summarization" else "Translation"
    return f"{bos}{user}\n\n{answer}:\n"


# Text is cut to this many characters per wanted token before tokenizing, so that memory and time are bounded by
# the token limit, not by the file (what a large document cost whole: docs/performance.md, "Figures behind the
# code's choices"). No token of an embedded tokenizer is this long, so the tokens kept are those of the whole text.
CHARS_PER_TOKEN_BOUND = 64


def truncate_document(tokenizer, document: str, max_tokens: int | None) -> str:
    """Cut the document at a token boundary so it holds at most max_tokens tokens."""
    if max_tokens is None:
        return document
    window = document[: max_tokens * CHARS_PER_TOKEN_BOUND]
    enc = tokenizer(window, add_special_tokens=False, return_offsets_mapping=True)
    if len(enc["input_ids"]) <= max_tokens:
        return window
    return document[: enc["offset_mapping"][max_tokens - 1][1]]


def char_bad_mask(record: Record) -> np.ndarray:
    bad = np.zeros(len(record.response), dtype=bool)
    for s in record.bad_spans:
        bad[s.start : s.end] = True
    return bad


def token_labels_from_offsets(response: str, bad_chars: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Label each token 0 (bad) if any non-space character it covers is bad, else 1 (good)."""
    labels = np.ones(len(offsets), dtype=np.int64)
    for i, (s, e) in enumerate(offsets):
        if any(bad_chars[j] and not response[j].isspace() for j in range(s, e)):
            labels[i] = 0
    return labels


def encode_record(
    tokenizer,
    record: Record,
    max_doc_tokens: int | None = 512,
    max_response_tokens: int | None = 160,
    end_of_turn: bool = True,
) -> Encoded:
    document = truncate_document(tokenizer, record.document, max_doc_tokens)
    prompt = build_prompt(tokenizer, document, record.task, record.meta.get("lang_pair"))
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    response = (
        record.response[: max_response_tokens * CHARS_PER_TOKEN_BOUND] if max_response_tokens else record.response
    )
    resp = tokenizer(response, add_special_tokens=False, return_offsets_mapping=True)
    resp_ids = resp["input_ids"][:max_response_tokens]
    offsets = np.asarray(resp["offset_mapping"][:max_response_tokens], dtype=np.int64).reshape(-1, 2)
    if not resp_ids:
        raise DataError(f"record {record.id!r}: the response tokenizes to nothing; give it some text.")
    if record.token_labels_known:
        resp_labels = token_labels_from_offsets(record.response, char_bad_mask(record), offsets)
    else:
        resp_labels = np.full(len(resp_ids), IGNORE, dtype=np.int64)
    tail = [tokenizer.eos_token_id] if end_of_turn and tokenizer.eos_token_id is not None else []
    ids = np.asarray(prompt_ids + resp_ids + tail, dtype=np.int64)
    labels = np.full(len(ids), IGNORE, dtype=np.int64)
    start = len(prompt_ids)
    labels[start : start + len(resp_ids)] = resp_labels
    return Encoded(ids, labels, start, start + len(resp_ids), offsets, record.id, record.sequence_label)


@dataclass
class Batch:
    """Right-padded tensors for a list of Encoded examples.

    `lm_mask` marks the next-token targets of language-model objectives: the response tokens and the end-of-turn
    token after them (never position 0, which has no prediction). A pair batch (see `collate_pairs`) holds the
    chosen responses in rows [0, B) and the rejected ones in rows [B, 2B); row i pairs with row B + i.

    A packed batch (`collate_packed`) holds several examples per row, each restarting `position_ids` at 0; the model
    then attends within each example only (transformers builds the block-diagonal mask from the position ids), so
    every token's output is the one it has in a padded batch. `attention_mask` still marks the real tokens (1) and
    the padding after the last example of a row (0); `forward_inputs` gives what the model is called with."""

    input_ids: torch.Tensor  # (B, T)
    attention_mask: torch.Tensor  # (B, T)
    labels: torch.Tensor  # (B, T) 1/0/-1
    response_mask: torch.Tensor  # (B, T) bool: response tokens (labelled or not)
    sequence_labels: torch.Tensor  # (B,) one per row; a packed batch's rows are no examples, so it has none (0,)
    lm_mask: torch.Tensor | None = None  # (B, T) bool: response tokens + end-of-turn token
    position_ids: torch.Tensor | None = None  # (B, T): set in packed batches only
    # what the losses average over, counted where the batch is built: on a GPU, counting there would wait for it
    n_labelled: int = -1  # tokens with a label 1/0 (-1: count them now)
    n_lm_targets: int = -1  # lm_mask positions
    # (n_lm_targets, 2) long: the (row, column) of each lm_mask target in row-major order, found where the batch is
    # built, so that the losses gather the targets by index (indexing by a mask on a GPU waits for the device to
    # count them)
    lm_positions: torch.Tensor | None = None
    n_pairs: int = 0  # a pair batch (collate_pairs): B, its chosen rows [0, B) and rejected rows [B, 2B); else 0

    def __post_init__(self) -> None:
        if self.n_labelled < 0:
            self.n_labelled = int((self.labels != IGNORE).sum())
        if self.lm_positions is None and self.lm_mask is not None:
            self.lm_positions = self.lm_mask.nonzero()
        if self.n_lm_targets < 0:  # a tensor's shape is known on the host, wherever the tensor is
            self.n_lm_targets = 0 if self.lm_positions is None else len(self.lm_positions)

    @property
    def packed(self) -> bool:
        return self.position_ids is not None

    def forward_inputs(self) -> dict[str, torch.Tensor]:
        """The model's keyword inputs: ids and the padding mask, or, packed, ids and the per-example positions
        (no mask: transformers reads the example boundaries from the positions only when the mask is None)."""
        if self.packed:
            return {"input_ids": self.input_ids, "attention_mask": None, "position_ids": self.position_ids}
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask}

    def to(self, device) -> "Batch":
        tensors = (
            self.input_ids,
            self.attention_mask,
            self.labels,
            self.response_mask,
            self.sequence_labels,
            self.lm_mask,
            self.position_ids,
            self.lm_positions,
        )
        if torch.device(device).type == "cuda":  # from pinned memory: a copy from pageable memory waits for the GPU
            moved = [None if t is None else t.pin_memory().to(device, non_blocking=True) for t in tensors]
        else:
            moved = [None if t is None else t.to(device) for t in tensors]
        *moved, lm_positions = moved
        return Batch(
            *moved,
            n_labelled=self.n_labelled,
            n_lm_targets=self.n_lm_targets,
            lm_positions=lm_positions,
            n_pairs=self.n_pairs,
        )

    @property
    def real_tokens(self) -> int:
        """Tokens that are not padding (read it before moving the batch to a GPU: on one it waits for the device)."""
        return int(self.attention_mask.sum())


def collate(examples: list[Encoded], pad_id: int, pad_to_multiple: int = 16) -> Batch:
    """Pad to a multiple of `pad_to_multiple` so batch shapes repeat (fewer distinct allocations, steadier memory)."""
    ids, att, lab, resp, lm, _ = _lay_out([[e] for e in examples], pad_id, pad_to_multiple)
    seq = torch.tensor([e.sequence_label for e in examples], dtype=torch.long)
    return Batch(ids, att, lab, resp, seq, lm)


def collate_packed(rows: list[list[Encoded]], pad_id: int, pad_to_multiple: int = 16) -> Batch:
    """One row per list of examples, laid end to end and right-padded to a common length (a multiple of
    `pad_to_multiple`); position_ids restart at 0 for every example, and the padding after a row's last example gets
    positions of its own (0, 1, …: a block of its own that no example attends to). A packed row is no example, so
    sequence_labels is empty."""
    ids, att, lab, resp, lm, pos = _lay_out(rows, pad_id, pad_to_multiple)
    return Batch(ids, att, lab, resp, torch.zeros(0, dtype=torch.long), lm, pos)


def _lay_out(rows: list[list[Encoded]], pad_id: int, pad_to_multiple: int) -> tuple[torch.Tensor, ...]:
    """The (B, T) tensors of rows of examples laid end to end: ids, attention mask, labels, response mask, LM-target
    mask and per-example positions."""
    T = -(-max(sum(len(e) for e in row) for row in rows) // pad_to_multiple) * pad_to_multiple
    B = len(rows)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    att = torch.zeros((B, T), dtype=torch.long)
    lab = torch.full((B, T), IGNORE, dtype=torch.long)
    resp = torch.zeros((B, T), dtype=torch.bool)
    lm = torch.zeros((B, T), dtype=torch.bool)
    pos = torch.zeros((B, T), dtype=torch.long)
    for i, row in enumerate(rows):
        at = 0
        for e in row:
            n = len(e)
            ids[i, at : at + n] = torch.from_numpy(e.input_ids)
            att[i, at : at + n] = 1
            lab[i, at : at + n] = torch.from_numpy(e.labels)
            pos[i, at : at + n] = torch.arange(n)
            resp[i, at + e.response_start : at + e.response_end] = True
            # the response, then the end-of-turn token encode_record appends (never an example's first position)
            lm[i, at + max(1, e.response_start) : at + n] = True
            at += n
        pos[i, at:] = torch.arange(T - at)
    return ids, att, lab, resp, lm, pos


@dataclass(frozen=True)
class EncodedPair:
    """A preference pair for the same prompt: chosen = the faithful response, rejected = the unfaithful one."""

    chosen: Encoded
    rejected: Encoded

    def __len__(self) -> int:
        return max(len(self.chosen), len(self.rejected))


def collate_pairs(pairs: list[EncodedPair], pad_id: int, pad_to_multiple: int = 16) -> Batch:
    """One batch of 2B rows, padded together: chosen responses in rows [0, B), rejected in rows [B, 2B)."""
    if not all(p.chosen.sequence_label == 1 and p.rejected.sequence_label == 0 for p in pairs):
        raise ValueError("a pair's chosen response must be labelled 1 (faithful) and its rejected one 0.")
    batch = collate([p.chosen for p in pairs] + [p.rejected for p in pairs], pad_id, pad_to_multiple)
    return replace(batch, n_pairs=len(pairs))
