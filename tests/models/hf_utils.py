"""Random tiny transformers Qwen2 models for parity tests (torch, float32 unless told)."""

import numpy as np
import torch
import transformers


def make_hf_model(path, *, heads=4, kv_heads=2, tied=True, layers=2, hidden=64,
                  intermediate=None, vocab=96, theta=10000.0, seed=0, dtype=None, save_kw=None,
                  **config_extra):
    """Random HF Qwen2 saved to `path`; weights drawn wider than HF's init (and norm scales
    around 1) so that every layer moves the logits and layout bugs cannot hide."""
    torch.manual_seed(seed)
    cfg = transformers.Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate or 2 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        tie_word_embeddings=tied, rope_parameters={"rope_type": "default", "rope_theta": theta},
        **config_extra)
    model = transformers.Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.15)
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(path, **(save_kw or {}))
    return model


def hf_logits(model, tokens, mask):
    """transformers' logits on a left-padded batch (positions = cumsum(mask) - 1)."""
    positions = np.clip(np.cumsum(mask, -1) - 1, 0, None)
    with torch.no_grad():
        out = model(input_ids=torch.tensor(tokens, dtype=torch.long),
                    attention_mask=torch.tensor(mask, dtype=torch.long),
                    position_ids=torch.tensor(positions, dtype=torch.long))
    return out.logits.float().numpy()
