//! What each fuzz target (`fuzz/fuzz_targets/`) feeds one input to: every reader of bytes
//! that come from outside (a harness's request, an upstream's answer). One copy, called by
//! libFuzzer in `scripts/fuzz.sh` and by `tests/fuzz_corpus.rs`, which replays the committed
//! corpus (`fuzz/corpus/`) on every test run. Each must return, never panic.

use super::{answer, anthropic, gemini, openai_chat, openai_responses, upstream};

/// Reads one input; returns whatever the input, never panics.
pub type Reader = fn(&[u8]);

/// The fuzz targets by name, as `cargo fuzz list` and `fuzz/corpus/<target>/` name them.
pub const TARGETS: [(&str, Reader); 5] = [
    ("anthropic", anthropic_request),
    ("gemini", gemini_request),
    ("openai_chat", openai_chat_request),
    ("openai_responses", openai_responses_request),
    ("upstream_answer", upstream_answer),
];

pub fn anthropic_request(body: &[u8]) {
    let _ = anthropic::normalize(body);
    let _ = anthropic::normalize_count(body);
}

pub fn gemini_request(body: &[u8]) {
    // generateContent, streamGenerateContent and countTokens read the same body.
    let _ = gemini::normalize(body, "gemini-2.5-pro", false);
    let _ = gemini::normalize(body, "gemini-2.5-pro", true);
    let _ = gemini::normalize_count(body, "gemini-2.5-pro");
}

pub fn openai_chat_request(body: &[u8]) {
    let _ = openai_chat::normalize(body);
}

pub fn openai_responses_request(body: &[u8]) {
    let _ = openai_responses::normalize(body);
}

/// What the upstream answered (any text), read for the sampled tokens, logprobs and message,
/// as vLLM's answer and as SGLang's.
pub fn upstream_answer(body: &[u8]) {
    if let Ok(text) = std::str::from_utf8(body) {
        for kind in [upstream::UpstreamKind::Vllm, upstream::UpstreamKind::Sglang] {
            for keep_logprobs in [false, true] {
                let _ = answer::read_answer(text, kind, keep_logprobs);
            }
        }
        let _ = upstream::upstream_error(400, text);
    }
}
