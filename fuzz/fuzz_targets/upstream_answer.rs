#![no_main]
use floe_gateway::protocol::upstream;
use libfuzzer_sys::fuzz_target;

// What the upstream answered (any JSON), read for the sampled tokens, logprobs and message, as
// vLLM's answer and as SGLang's.
fuzz_target!(|body: &[u8]| {
    if let Ok(answer) = serde_json::from_slice::<serde_json::Value>(body) {
        for kind in [upstream::UpstreamKind::Vllm, upstream::UpstreamKind::Sglang] {
            let _ = upstream::read_sampled(&answer, kind);
        }
    }
    if let Ok(text) = std::str::from_utf8(body) {
        let _ = upstream::upstream_error(400, text);
    }
});
