#![no_main]
use floe_gateway::protocol::anthropic;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    let _ = anthropic::normalize(body);
    let _ = anthropic::normalize_count(body);
});
