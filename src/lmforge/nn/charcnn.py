"""ELMo's character token encoder: char ids -> char CNN (several widths, max-pooled) -> highway -> projection.

As in the original (Peters et al. 2018, after Kim et al. 2016): every token is spelled as UTF-8
bytes between a begin-of-word and an end-of-word marker; each byte gets a small embedding; one 1-D
convolution per filter width slides over the spelling and is max-pooled over the characters; the
concatenated features pass two highway layers and a linear projection to the LSTM width.

lmforge's tokens are subword pieces, so the spelling is derived from the tokenizer's piece strings:
WordPiece continuation pieces (``##ing``) lose the ``##`` and get *no* begin-of-word marker, and
byte-level BPE pieces are mapped back to their bytes, where a leading space (``Ġ``) means "starts a
word" and becomes the begin-of-word marker.  Special tokens are spelled with their own marker.

Character ids: 0 = padding, 1..256 = byte value + 1, then the markers below.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

PAD_CHAR = 0
BOW_CHAR = 257  # begin of word
EOW_CHAR = 258  # end of word / piece
SPECIAL_CHAR = 259  # marks a special token ([CLS], <|endoftext|>, ...)
NUM_CHARS = 260


@lru_cache(maxsize=1)
def _byte_level_decoder() -> dict[str, int]:
    """Inverse of the byte -> printable-unicode table of byte-level BPE (GPT-2's alphabet).

    Printable Latin-1 bytes map to themselves; the other 68 bytes map, in byte order, to
    code points 256, 257, ...  (so the space byte 0x20 is ``Ġ`` U+0120).
    """
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    table: dict[str, int] = {chr(b): b for b in keep}
    extra = 0
    for b in range(256):
        if b not in table.values():
            table[chr(256 + extra)] = b
            extra += 1
    return table


def piece_bytes(piece: str, kind: str) -> tuple[bytes, bool]:
    """Spell one tokenizer piece as bytes and say whether it starts a word.

    Args:
        piece: the token string as the tokenizer stores it (``"##ing"``, ``"Ġthe"``, ``"the"``).
        kind: ``"wordpiece"`` or ``"bpe"`` (byte-level).
    Returns:
        (the piece's bytes without markers, True if the piece begins a word).
    """
    if kind == "bpe":
        dec = _byte_level_decoder()
        if all(c in dec for c in piece):
            raw = bytes(dec[c] for c in piece)
        else:  # not a byte-level string (should not happen); spell it as UTF-8
            raw = piece.encode("utf-8")
        if raw[:1] == b" ":
            return raw[1:], True
        return raw, False
    if piece.startswith("##") and len(piece) > 2:
        return piece[2:].encode("utf-8"), False
    return piece.encode("utf-8"), True


def spell_piece(piece: str, kind: str, max_chars: int, special: bool = False) -> list[int]:
    """Char ids of one piece, padded with 0 to ``max_chars``.

    Layout: ``[BOW?] bytes... EOW`` (``[BOW] SPECIAL bytes... EOW`` for special tokens); bytes
    beyond ``max_chars - 2`` are cut, so the end-of-word marker is always present.
    """
    if special:
        raw, starts, lead = piece.encode("utf-8"), True, [SPECIAL_CHAR]
    else:
        raw, starts = piece_bytes(piece, kind)
        lead = []
    head = ([BOW_CHAR] if starts else []) + lead
    room = max_chars - len(head) - 1
    ids = head + [b + 1 for b in raw[: max(room, 0)]] + [EOW_CHAR]
    return ids[:max_chars] + [PAD_CHAR] * (max_chars - len(ids))


def vocab_char_ids(tokenizer, max_chars: int) -> torch.Tensor:
    """Char ids of every vocabulary entry of an lmforge ``Tokenizer``.

    Args:
        tokenizer: has ``vocab_size``, ``id_to_token(i)``, ``kind`` and ``special_ids``.
        max_chars: characters per token, markers included.
    Returns:
        (V, max_chars) int16 tensor, row i = spelling of token id i.
    """
    special = set(getattr(tokenizer, "special_ids", set()))
    rows = []
    for i in range(tokenizer.vocab_size):
        piece = tokenizer.id_to_token(i)
        rows.append(spell_piece("" if piece is None else piece, tokenizer.kind, max_chars, special=i in special))
    return torch.tensor(rows, dtype=torch.int16)


class Highway(nn.Module):
    """``y = g * x + (1 - g) * relu(W_h x)`` with ``g = sigmoid(W_g x)``, ``num_layers`` times.

    The gate bias starts at +1 so that the layers initially mostly carry their input through.
    """

    def __init__(self, size: int, num_layers: int = 2):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(size, 2 * size) for _ in range(num_layers))
        for layer in self.layers:
            with torch.no_grad():
                layer.bias[size:].fill_(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (N, C) -> (N, C)."""
        for layer in self.layers:
            h, g = layer(x).chunk(2, dim=-1)
            g = torch.sigmoid(g)
            x = g * x + (1.0 - g) * F.relu(h)
        return x


class CharCNNEncoder(nn.Module):
    """Token ids -> (spelling -> char CNN -> highway -> projection) vectors.

    The spelling of every vocabulary entry is a buffer (``token_chars``, (V, W) int16) filled once
    from the tokenizer by :meth:`set_token_chars`; it is saved with the weights, so a model folder
    needs no tokenizer to rebuild it and old folders keep their spelling even if the spelling rules
    change.  Each forward encodes only the distinct ids of the batch.

    Args:
        vocab_size: V.
        max_chars: W, characters per token.
        char_embed_dim: size of each character embedding.
        filters: ``[(width, n_filters), ...]``; the original uses widths 1..7 with 32..1024 filters.
        num_highway: highway layers after the CNN.
        output_dim: projection size (the LSTM input width).
    """

    def __init__(
        self,
        vocab_size: int,
        max_chars: int,
        char_embed_dim: int,
        filters: Sequence[Sequence[int]],
        num_highway: int,
        output_dim: int,
    ):
        super().__init__()
        if any(w > max_chars for w, _ in filters):
            raise ValueError(f"a filter is wider than max_chars={max_chars}")
        self.register_buffer("token_chars", torch.zeros(vocab_size, max_chars, dtype=torch.int16))
        self.char_embedding = nn.Embedding(NUM_CHARS, char_embed_dim, padding_idx=PAD_CHAR)
        self.convs = nn.ModuleList(nn.Conv1d(char_embed_dim, n, kernel_size=w) for w, n in filters)
        n_features = sum(n for _, n in filters)
        self.highway = Highway(n_features, num_highway)
        self.projection = nn.Linear(n_features, output_dim)

    @torch.no_grad()
    def set_token_chars(self, char_ids: torch.Tensor) -> None:
        """Install the (V, W) spelling table (from :func:`vocab_char_ids`)."""
        if char_ids.shape != self.token_chars.shape:
            raise ValueError(f"char table {tuple(char_ids.shape)} does not fit {tuple(self.token_chars.shape)}")
        self.token_chars.copy_(char_ids.to(self.token_chars.dtype))

    def encode_chars(self, chars: torch.Tensor) -> torch.Tensor:
        """chars: (N, W) char ids -> (N, output_dim).

        Each filter's feature is ``relu(max over windows)`` (= max of the relu'd windows), the
        windows being those that touch the spelling plus one all-padding window, whose value is the
        filter's bias (the padding embedding is zero).  Only the columns up to the longest spelling
        in ``chars`` plus the widest filter are convolved, so short spellings are not convolved over
        all 50 columns, and a token's vector does not depend on the other tokens of the batch.
        """
        widest = max(conv.kernel_size[0] for conv in self.convs)
        longest = int((chars != PAD_CHAR).sum(dim=1).max()) if chars.numel() else 0
        chars = chars[:, : min(chars.shape[1], max(longest + widest - 1, widest))]
        x = self.char_embedding(chars).transpose(1, 2)  # (N, E, W')
        feats = []
        for conv in self.convs:
            m = conv(x).max(dim=-1).values  # (N, n_filters); max(): a cheaper backward than amax()
            # max(m, bias) written as relu(m - bias) + bias: a cheaper backward than torch.maximum
            feats.append(F.relu(F.relu(m - conv.bias) + conv.bias))
        return self.projection(self.highway(torch.cat(feats, dim=-1)))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids: (B, T) -> (B, T, output_dim)."""
        uniq, inverse = torch.unique(input_ids, return_inverse=True)  # (U,), (B, T)
        vectors = self.encode_chars(self.token_chars[uniq].long())  # (U, C)
        return vectors[inverse]  # (B, T, C)
