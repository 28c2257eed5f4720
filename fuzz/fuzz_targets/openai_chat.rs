#![no_main]
// The body lives in floe_gateway (one copy): tests/fuzz_corpus.rs replays this target's corpus.
use floe_gateway::protocol::fuzz_inputs;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| fuzz_inputs::openai_chat_request(body));
