//! Wire formats of the provider APIs, one module each, as pure functions between the
//! provider's JSON and OpenAI Chat Completions (what vLLM serves). No IO here.

pub mod anthropic;
pub mod errors;
pub mod gemini;
pub mod openai_chat;
pub mod openai_responses;
pub mod upstream;

pub use errors::ProtocolError;

use serde_json::{Map, Value};

/// A provider request translated for the upstream (OpenAI Chat Completions), with what the
/// reply needs to know about the original.
#[derive(Debug, Default, PartialEq)]
pub struct Normalized {
    pub request: Map<String, Value>,
    pub stream: bool,
    /// The model name the harness asked for (echoed in the reply).
    pub model: String,
    /// What could not be expressed upstream and was dropped, e.g. `hosted_tool:web_search`.
    pub dropped: Vec<String>,
    /// OpenAI: the client asked for logprobs in the reply.
    pub wants_logprobs: bool,
    /// OpenAI: `stream_options.include_usage`.
    pub include_usage: bool,
    /// Gemini `streamGenerateContent` without `alt=sse`: the reply is a JSON array of chunks.
    pub reply_as_array: bool,
    /// Responses: freeform `custom` tools, whose calls go back as `custom_tool_call`.
    pub custom_tools: std::collections::BTreeSet<String>,
}
