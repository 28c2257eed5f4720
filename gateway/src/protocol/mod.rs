//! Wire formats of the provider APIs, one module each, as pure functions between the
//! provider's JSON and OpenAI Chat Completions (what vLLM serves). No IO here.

pub mod errors;
pub mod openai_chat;
pub mod upstream;

pub use errors::ProtocolError;
