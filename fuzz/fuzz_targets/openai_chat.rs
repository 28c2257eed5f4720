#![no_main]
use floe_gateway::protocol::openai_chat;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    let _ = openai_chat::normalize(body);
});
