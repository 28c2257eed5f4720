"""The File push writes the weights in the dtype vLLM serves: the file is no larger than what
vLLM keeps, and never narrower than it (a narrower file would round weights vLLM keeps
wider)."""

import torch
from safetensors.torch import load_file
from tiny import tiny_llama

from floe_trainer.vllm_sync import push_dtype, save_weights


def test_the_push_dtype_is_vllms_when_the_job_says_it_else_the_fp32_weights():
    # vLLM's --dtype, as the operator and floe run pass it (servingDtype).
    assert push_dtype("bfloat16") is torch.bfloat16
    assert push_dtype("float16") is torch.float16
    assert push_dtype("float32") is torch.float32
    # auto (unset) or a name the trainer does not know: the weights go as trained; vLLM's
    # own choice under auto depends on its platform, and nothing is guessed.
    assert push_dtype(None) is None
    assert push_dtype("fp8") is None


def test_a_bf16_push_writes_every_weight_in_bf16_the_tied_head_included(tmp_path):
    model = tiny_llama()
    model.config.tie_word_embeddings = True
    model.tie_weights()
    save_weights(model, tmp_path, torch.bfloat16)
    written = load_file(str(tmp_path / "model.safetensors"))
    state = model.state_dict()
    assert written.keys() == state.keys()
    assert "lm_head.weight" in written
    for name, tensor in written.items():
        assert tensor.dtype == torch.bfloat16, name
        torch.testing.assert_close(tensor, state[name].to(torch.bfloat16), rtol=0, atol=0)
    fp32 = tmp_path / "fp32"
    fp32.mkdir()
    save_weights(model, fp32)
    assert all(
        t.dtype == torch.float32 for t in load_file(str(fp32 / "model.safetensors")).values()
    )
    # Half the bytes.
    size = (tmp_path / "model.safetensors").stat().st_size
    assert size < 0.6 * (fp32 / "model.safetensors").stat().st_size
