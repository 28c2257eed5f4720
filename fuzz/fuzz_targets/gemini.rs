#![no_main]
use floe_gateway::protocol::gemini;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    // generateContent, streamGenerateContent and countTokens read the same body.
    let _ = gemini::normalize(body, "gemini-2.5-pro", false);
    let _ = gemini::normalize(body, "gemini-2.5-pro", true);
    let _ = gemini::normalize_count(body, "gemini-2.5-pro");
});
