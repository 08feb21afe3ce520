"""Byte-level tokenizer: token id = byte value, plus three specials after the 256 bytes."""

from __future__ import annotations

BOS_ID = 256
EOS_ID = 257
PAD_ID = 258
NUM_SPECIAL = 3
VOCAB_SIZE = 256 + NUM_SPECIAL


class ByteTokenizer:
    """UTF-8 bytes in, bytes out; invalid UTF-8 in decoded output is replaced, never raised."""

    bos_token_id = BOS_ID
    eos_token_id = EOS_ID
    pad_token_id = PAD_ID
    vocab_size = VOCAB_SIZE

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [BOS_ID, *ids] if add_bos else ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        out = bytearray()
        for token in ids:
            if 0 <= token < 256:
                out.append(token)
            elif not skip_special_tokens:
                out.extend(self.special_name(token).encode())
        return out.decode("utf-8", errors="replace")

    def token_text(self, token: int) -> str:
        """Text of one token for logprob listings (a lone byte may be a partial character)."""
        if 0 <= token < 256:
            return bytes([token]).decode("utf-8", errors="replace")
        return self.special_name(token)

    @staticmethod
    def special_name(token: int) -> str:
        return {BOS_ID: "<bos>", EOS_ID: "<eos>", PAD_ID: "<pad>"}.get(token, f"<unk:{token}>")
