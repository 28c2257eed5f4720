import torch

from floe_trainer.policy import make_batch
from floe_trainer.wire import Trace


def trace(prompt, response, mask, logprobs):
    return Trace(
        prompt_token_ids=prompt, response_token_ids=response, loss_mask=mask, logprobs=logprobs
    )


def test_make_batch_pads_and_indexes_the_response_tokens():
    b = make_batch(
        [
            trace([5, 6, 7], [8, 9], [1, 0], [-0.5, None]),
            trace([1], [2, 3, 4], [1, 1, 1], [-1.0, -2.0, -3.0]),
            trace([1, 2], [], [], []),
        ],
        pad_id=99,
    )
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9], [1, 2, 3, 4, 99], [1, 2, 99, 99, 99]]
    assert b.attention_mask.tolist() == [[1] * 5, [1, 1, 1, 1, 0], [1, 1, 0, 0, 0]]
    # The logits row predicting response token j is prompt_len - 1 + j.
    assert b.positions.tolist() == [[2, 3, 0], [0, 1, 2], [0, 0, 0]]
    assert b.response_ids.tolist() == [[8, 9, 0], [2, 3, 4], [0, 0, 0]]
    assert b.loss_mask.tolist() == [[1, 0, 0], [1, 1, 1], [0, 0, 0]]
    assert b.behaviour.dtype == torch.float64
    assert b.behaviour.tolist() == [[-0.5, 0, 0], [-1, -2, -3], [0, 0, 0]]
    assert b.behaviour_known.tolist() == [[True, False, False], [True] * 3, [False] * 3]
