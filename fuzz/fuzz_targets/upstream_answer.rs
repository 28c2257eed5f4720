#![no_main]
use floe_gateway::protocol::{answer, upstream};
use libfuzzer_sys::fuzz_target;

// What the upstream answered (any text), read for the sampled tokens, logprobs and message, as
// vLLM's answer and as SGLang's.
fuzz_target!(|body: &[u8]| {
    if let Ok(text) = std::str::from_utf8(body) {
        for kind in [upstream::UpstreamKind::Vllm, upstream::UpstreamKind::Sglang] {
            for keep_logprobs in [false, true] {
                let _ = answer::read_answer(text, kind, keep_logprobs);
            }
        }
        let _ = upstream::upstream_error(400, text);
    }
});
